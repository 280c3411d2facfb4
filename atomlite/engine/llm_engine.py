"""The synchronous engine: add requests, step, collect outputs. Model-agnostic: it reads the model's KV specs."""
import logging
import time
import weakref
from dataclasses import dataclass

import torch

from atomlite.config import EngineConfig
from atomlite.distributed.parallel import SINGLE
from atomlite.engine.images.encoder_cache import EncoderCache, encoder_cache_bytes
from atomlite.engine.images.image_budget import ImageScheduling
from atomlite.engine.images.image_embeds import ImageEmbedder
from atomlite.engine.runner.launched import LaunchedStep, VerifiedStep
from atomlite.engine.sampling.logits_controls import TokenHistory
from atomlite.engine.runner.rank import EngineRank, construct_model
from atomlite.engine.sampling.sampler import sample_ids, token_logprobs
from atomlite.engine.scheduler import Scheduler
from atomlite.engine.images.seq_images import SeqItem, placed_images
from atomlite.lora.manager import LoRAManager
from atomlite.lora.request import LoRARequest
from atomlite.engine.sequence import Sequence, Status
from atomlite.engine.spec.drafters import drafting_allowed
from atomlite.engine.spec.stats import SpecStats
from atomlite.engine.spec.verify import VerifyRows, verify
from atomlite.engine.sampling.structured import StructuredOutputs
from atomlite.cpu_threads import engine_threads, use_threads
from atomlite.engine.updates import EngineStats, SeqUpdate
from atomlite.engine.runner.warmup import warm_up
from atomlite.model_ops.platform import detect_platform
from atomlite.multimodal.inputs import MultiModalPrompt
from atomlite.sampling_params import SamplingParams
from atomlite.tokenizer import load_tokenizer

logger = logging.getLogger("atomlite")


def check_prompt(token_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    if not token_ids:
        raise ValueError("the prompt is empty")
    if not all(isinstance(t, int) and 0 <= t < vocab_size for t in token_ids):
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise ValueError(f"the prompt has {len(token_ids)} tokens; the context length (--max-model-len) is "
                         f"{max_model_len}, which must leave room for at least one new token")


def close_ranks(runner, workers) -> None:
    """The graphs that captured the group's collectives go first, then the other ranks."""
    if runner is not None:
        runner.release_graphs()
    workers.close()


GRAMMAR_WAIT_S = 0.05  # an engine with nothing to run but grammars compiling checks on them this often


@dataclass
class UnsampledStep:
    """A decode step launched ahead whose rows are sampled only after the host has appended the tokens it read:
    a structured_outputs grammar must accept each token before it can mask the next. The forward still runs
    while the host takes the tokens and fills the masks."""
    seqs: list[Sequence]
    logits: torch.Tensor


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = config.torch_device
        threads, self.threads_note = engine_threads(config.cpu_threads)
        use_threads(threads)
        self.workers = self._start_workers(config)
        try:
            self._build(config, EngineRank(config, self.workers.tp if self.workers else SINGLE))
        except BaseException:
            self.close()
            raise
        if self.workers is not None:
            self.workers.started = True
            weakref.finalize(self, close_ranks, self.runner, self.workers)  # dropped, or alive at exit

    def _build(self, config: EngineConfig, rank: EngineRank) -> None:
        self.kernels, self.model, self.assistant, self.kv_specs = rank.kernels, rank.model, rank.assistant, rank.kv_specs
        self.kv_scales_note, self.memory, self.kv_plan = rank.kv_scales_note, rank.memory, rank.kv_plan
        self.kv, self.runner, self.graph_note = rank.kv, rank.runner, rank.graph_note
        self.all_reduce_note = rank.all_reduce_note
        self.runner.followers = self.workers
        self._hidden_rows: dict[int, int] = {}  # seq_id -> its row of runner.hidden: the state before its newest token
        self.set_drafter(rank.drafter, rank.num_speculative_tokens)
        self.warmup_note = (warm_up(self.runner, self.kv, config.max_num_batched_tokens, config.max_model_len - 1,
                                    self.device) if self.device.type == "cuda" else "")
        self.loras = LoRAManager(rank.loras) if rank.loras is not None else None
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len,
                                   config.scheduling_policy, self._image_scheduling(),
                                   config.max_loras if self.loras else None)
        self.tokenizer = load_tokenizer(config.tokenizer_path)
        self.eos_token_ids = set(config.model_spec.eos_token_ids) | set(config.generation_defaults.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.vocab_size = config.model_spec.hf["vocab_size"]
        self.structured = StructuredOutputs(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.generator = torch.Generator(self.device).manual_seed(config.seed)
        self._generators: dict[int, torch.Generator] = {}
        self.requests: dict[str, Sequence] = {}
        self._ahead: LaunchedStep | None = None  # a decode step launched before the tokens it reads were taken
        self.iteration_tokens: list[int] = []  # tokens of each forward pass launched by the last step()
        self.step_prefilled = False  # whether the last step()'s forward passes held prompt tokens
        self.served_by = None  # the thread of an engine client's core that steps this engine, while it runs

    def served(self) -> bool:
        """Whether an engine client's core thread steps this engine now (served_by, while that thread runs)."""
        return self.served_by is not None and self.served_by.is_alive()

    def _image_scheduling(self) -> ImageScheduling:
        """A model with an encoder (a vision or audio tower): rank 0's runner encodes each step's items through the
        encoder cache, which the scheduler reads to count the step's encoder budget."""
        budget = self.config.max_num_encoder_input_tokens
        if not getattr(self.model, "encoder_placeholders", None):
            return ImageScheduling(budget)
        cache = EncoderCache(encoder_cache_bytes(self.config))
        self.runner.images = ImageEmbedder(self.model, cache, self.device)
        return ImageScheduling(budget, cache.__contains__)

    @staticmethod
    def _start_workers(config: EngineConfig):
        """Ranks 1..N-1 under tensor parallelism (engine/runner/workers.py); None on one. A size the model's shapes cannot be
        split by fails here, before any process starts (its error names the config key)."""
        if config.tensor_parallel_size == 1:
            return None
        from atomlite import distributed
        from atomlite.engine.runner.workers import Workers
        with distributed.use(distributed.TensorParallel(0, config.tensor_parallel_size)):
            construct_model(config, "meta", detect_platform(config.torch_device))
        return Workers(config)

    def close(self) -> None:
        """Stops the other tensor-parallel ranks' processes (a single-rank engine has none)."""
        if self.workers is not None:
            close_ranks(getattr(self, "runner", None), self.workers)

    def set_drafter(self, drafter, num_speculative_tokens: int) -> None:
        """Speculative decoding with drafter (spec.drafters), k drafts per step; None turns it off. The engine sets
        its own from speculative_config; benchmarks and tests set measurement drafters (ReplayDrafter)."""
        self.drafter, self.num_speculative_tokens = drafter, num_speculative_tokens
        self.runner.keep_hidden = drafter is not None and drafter.needs_hidden
        graphs = self.runner.graphs
        if self.runner.keep_hidden and graphs is not None and not graphs.keep_hidden:
            raise ValueError("a drafter that reads the target's hidden states must be set before decode graphs are "
                             "captured (speculative_config)")
        self.spec_stats = SpecStats(num_speculative_tokens)

    def describe(self) -> list[str]:
        """The startup report: the model, memory split, KV plan, decode graphs and each op's kernel."""
        spec = self.config.model_spec
        lines = [f"model: {spec.path} ({spec.architecture}, {len(spec.layers)} layers, "
                 f"dtype {str(self.config.torch_dtype).removeprefix('torch.')}, device {self.device})"]
        if self.memory is not None:
            lines.append(self.memory.describe())
        lines += self.kv_plan.describe()
        lines.append(f"CPU threads: {self.threads_note}")
        if self.kv_scales_note:
            lines.append(self.kv_scales_note)
        from atomlite.model_ops.fp8_linear import fp8_note
        fp8_line = fp8_note(self.model, detect_platform(self.device))
        if fp8_line:
            lines.append(fp8_line)
        if getattr(self.model, "row_copy_note", None):
            lines.append(self.model.row_copy_note)
        if self.config.speculative_config is not None:
            lines.append(self.config.speculative_config.describe())
        if self.workers is not None:
            lines.append(f"tensor parallel: {self.workers.tp.size} ranks ({torch.distributed.get_backend()}); the "
                         f"memory, KV plan and kernels here are rank 0's, and each rank's are the same; "
                         f"{self.all_reduce_note}")
        lines.append(self.graph_note)
        if self.warmup_note:
            lines.append(self.warmup_note)
        lines.append("kernels:")
        lines += [f"  {line}" for line in self.kernels.describe()]
        return lines

    # -- requests -------------------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{self.config.model} has no tokenizer: pass token ids instead of text")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def validate_prompt(self, token_ids: list[int]) -> None:
        check_prompt(token_ids, self.vocab_size, self.config.max_model_len)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    priority: int = 0, multimodal: MultiModalPrompt | None = None,
                    lora_request: LoRARequest | None = None) -> Sequence:
        """priority: with --scheduling-policy priority, lower values run first (ties by arrival). multimodal: the
        prompt's images and video frames (the input side's MultiModalPrompt; prompt is then its token ids).
        lora_request: the LoRA adapter it runs with (enable_lora); None: the base model."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.config.check_priority(priority)
        params.validate()
        params.bind_to_model(self.tokenizer, self.vocab_size)
        token_ids = self.encode(prompt)
        self.validate_prompt(token_ids)
        images = self._images_of(token_ids, multimodal) if multimodal is not None else []
        seq = Sequence(token_ids, params, request_id, priority, images=images)
        if lora_request is not None:
            if self.loras is None:
                raise ValueError(f"LoRA {lora_request.lora_name!r} was requested but LoRA is not enabled (start "
                                 f"with enable_lora=True, --enable-lora)")
            self.loras.prepare(seq, lora_request)  # reads and checks the adapter
        # a grammar not compiled yet compiles on its own thread: the sequence waits for it, the batch runs on
        waits = params.structured_outputs is not None and not self.structured.start(seq)
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None] * len(token_ids)
        if params.seed is not None:
            self._generators[seq.seq_id] = torch.Generator(self.device).manual_seed(params.seed)
        self.requests[request_id] = seq
        if not waits:
            self.scheduler.add(seq)
        return seq

    def _images_of(self, token_ids: list[int], multimodal: MultiModalPrompt) -> list[SeqItem]:
        """The prompt's encoder items (images, video frames, audio clips), each checked against the model's
        towers: the model declares the placeholder token of each modality it takes."""
        placeholders = getattr(self.model, "encoder_placeholders", None) or {}
        for item in multimodal.items:
            if item.modality not in placeholders:
                tower = "audio" if item.modality == "audio" else "vision"
                takes = ", ".join(sorted(placeholders)) or "text only"
                raise ValueError(f"the model {self.config.model} has no {tower} tower: it takes {takes}")
        if token_ids != multimodal.prompt_token_ids:
            raise ValueError("the prompt's token ids differ from its multimodal prompt's prompt_token_ids")
        if not multimodal.items:
            return []
        config = self.config
        return placed_images(multimodal, placeholders, config.max_num_batched_tokens,
                             config.max_num_encoder_input_tokens,
                             tuple(getattr(self.model, "bidirectional_modalities", ())))

    def abort(self, request_id: str) -> None:
        seq = self.requests.get(request_id)
        if seq is not None:
            self._finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self.structured.compiling

    def _take_compiled(self) -> list[SeqUpdate]:
        """Queues the sequences whose grammar is ready; fails those whose grammar did not compile (in time). With
        nothing else to run, waits a little for a compile rather than spinning."""
        if not self.structured.compiling:
            return []
        ready, failed = self.structured.compiled(wait_s=0.0 if self.scheduler.has_work() else GRAMMAR_WAIT_S)
        for seq in ready:
            self.scheduler.add(seq)
        for seq, _ in failed:
            self._generators.pop(seq.seq_id, None)
            self.requests.pop(seq.request_id, None)
        return [SeqUpdate(seq.request_id, [], error=error, invalid=True) for seq, error in failed]

    # -- stepping -------------------------------------------------------------------------------------------
    def step(self) -> list[SeqUpdate]:
        """Runs one forward pass; returns an update for each sequence that got a token or finished. With
        overlap_decode, a decode step of the same sequences is launched before this step's tokens are read (its
        input ids stay on the device), so the GPU runs it while the host does this step's work; the next call
        returns its tokens."""
        try:
            return self._step()
        except Exception as e:  # a collective fails when a peer died: say which rank and how, not "connection reset"
            died = self.workers.death() if self.workers is not None else None
            if died is None:
                raise
            raise RuntimeError(f"{died}: the ranks left cannot go on") from e

    def _step(self) -> list[SeqUpdate]:
        self.iteration_tokens, self.step_prefilled = [], False
        failed = self._take_compiled()
        launched, self._ahead = self._ahead or self._run_scheduled(), None
        if launched is None:
            return failed
        if self._can_run_ahead(launched.seqs):
            self._ahead = self._run_ahead(launched)
        done = self._take_tokens(launched)
        if self._ahead is not None:
            self._settle_ahead()
        if isinstance(launched, VerifiedStep):
            self._settle_verified(launched)
        if self.drafter is not None:
            self._draft(done)
        now = time.monotonic()
        return failed + [self._update(seq, now) for seq in done]

    def _update(self, seq: Sequence, now: float) -> SeqUpdate:
        sent = seq.num_sent_tokens
        new = seq.output_token_ids_from(sent)
        seq.num_sent_tokens += len(new)
        update = SeqUpdate(seq.request_id, new, seq.logprobs[sent:] if seq.params.logprobs is not None else None,
                           seq.finish_reason, num_cached_tokens=seq.num_cached_tokens)
        if sent == 0:
            if seq.params.prompt_logprobs is not None:
                update.prompt_logprobs = seq.prompt_logprobs
            update.queue_s = seq.first_scheduled_time - seq.arrival_time
            update.prefill_s = now - seq.first_scheduled_time
        return update

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        return EngineStats(len(scheduler.running), len(scheduler.waiting),
                           [(spec.kind, used, total) for spec, used, total in self.kv.usage()],
                           scheduler.num_preemptions, scheduler.prefix_cache_queries, scheduler.prefix_cache_hits,
                           self.iteration_tokens, spec=self.spec_stats.snapshot() if self.drafter else None,
                           forward_passes=dict(self.runner.forward_passes),
                           lora=self.loras.usage(scheduler) if self.loras is not None else None)

    def _run_scheduled(self) -> LaunchedStep | None:
        """The scheduler's next batch, launched; None when no sequence samples from it."""
        batch = self.scheduler.schedule()
        if not batch:
            return None
        self.step_prefilled = any(num_new > 1 or seq.num_uncomputed > 1 for seq, num_new in batch)
        if self.loras is not None:
            self.runner.lora_loads += self.loras.assign(batch, self.scheduler.running)
        logits, rows = self.runner.execute(batch)
        sample_seqs = [seq for seq, _ in rows.sample]
        bitmask = self._grammar_bitmask(sample_seqs)  # built on the host while the GPU runs the forward just launched
        self.iteration_tokens.append(sum(num_new for _, num_new in batch))
        self._record_prompt_logprobs(logits, rows.prompt)
        self._hidden_rows = {seq.seq_id: row for seq, row in rows.sample}
        self.scheduler.update_from_output(batch, {seq.seq_id for seq, _ in rows.verify})
        if rows.verify:
            return self._verified(logits, rows, bitmask)
        if not rows.sample:
            return None
        sample_rows = [row for _, row in rows.sample]
        # decode steps sample every row in order: a slice, not a gather (which would copy indices to the GPU)
        in_order = sample_rows == list(range(len(sample_rows)))
        return self._sample(logits[:len(sample_rows)] if in_order else logits[sample_rows], sample_seqs,
                            bitmask=bitmask)

    def _grammar_bitmask(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The tokens the structured_outputs grammars allow each row; None when no row has one."""
        return self.structured.bitmask(seqs, self.device) if self.structured.constrains(seqs) else None

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], in_flight: torch.Tensor | None = None,
                bitmask: torch.Tensor | None = None) -> LaunchedStep:
        """in_flight: for a step launched ahead, each sequence's newest token, not yet in its token_ids (what
        penalties, min_tokens and bad_words count besides the host's tokens). bitmask: the tokens each row's
        structured_outputs grammar allows (StructuredOutputs.bitmask)."""
        ids = sample_ids(logits, [s.params for s in seqs], [self._generators.get(s.seq_id) for s in seqs],
                         self.generator, TokenHistory(seqs, self.eos_token_ids, in_flight), bitmask)
        want_logprobs = any(s.params.logprobs is not None for s in seqs)
        return LaunchedStep.start(seqs, ids, torch.log_softmax(logits, dim=-1) if want_logprobs else None)

    def _can_run_ahead(self, seqs: list[Sequence]) -> bool:
        """Whether the next step is sure to be these sequences decoding one token each, as the scheduler would
        pick it: nothing waiting can be admitted (Scheduler.admission_refused), every running sequence sampled, none
        can only finish, and a graph bucket holds them. A batch with a structured_outputs row runs its forward ahead but samples once the host
        has the tokens (UnsampledStep): the next mask depends on the token still on its way."""
        scheduler = self.scheduler
        return (self.config.overlap_decode and self.drafter is None and scheduler.admission_refused()
                and scheduler.running == seqs
                and len(seqs) <= scheduler.max_num_batched_tokens and self.runner.can_run_ahead(len(seqs))
                and not any(self._last_token_pending(seq) for seq in seqs))

    def _last_token_pending(self, seq: Sequence) -> bool:
        """Whether the token on its way is seq's last whatever it is (max_tokens or the context length)."""
        return (seq.num_output_tokens + 1 >= seq.params.max_tokens
                or len(seq.token_ids) + 1 >= self.config.max_model_len)

    def _run_ahead(self, launched: LaunchedStep) -> LaunchedStep | None:
        """The decode step after `launched`, its input ids the ones launched sampled; None if KV blocks for it
        would need a preemption (the scheduler decides that once the tokens are in)."""
        seqs = launched.seqs
        if not all(self.kv.allocate(seq, 1) for seq in seqs):
            return None
        logits = self.runner.execute_ahead(seqs, launched.ids)
        self.iteration_tokens.append(len(seqs))
        self.scheduler.advance_ahead(seqs)
        if self.structured.constrains(seqs):
            return UnsampledStep(seqs, logits)
        return self._sample(logits, seqs, in_flight=launched.ids)

    def _take_tokens(self, launched: LaunchedStep) -> list[Sequence]:
        """Appends each sequence's sampled token (skipping sequences aborted since the launch) and checks whether
        it finished; returns the sequences that got one."""
        done = []
        for i, (seq, run) in enumerate(zip(launched.seqs, launched.runs())):
            if seq.is_finished:
                continue
            for j, token in enumerate(run):
                seq.token_ids.append(token)
                if seq.params.logprobs is not None:
                    seq.logprobs.append(token_logprobs(launched.logprobs_of(i, j), token, seq.params.logprobs))
                self._check_finished(seq, token)
                if seq.is_finished:
                    break
            done.append(seq)
        return done

    def _settle_ahead(self) -> None:
        """After the tokens the step ahead read are appended: its sequences' full blocks get their prefix-cache
        hashes; a step ahead whose sequences all finished is dropped (its tokens are never read)."""
        running = [seq for seq in self._ahead.seqs if not seq.is_finished]
        self.scheduler.settle_ahead(running)
        if not running:
            self._ahead = None
        elif isinstance(self._ahead, UnsampledStep):  # the grammars have seen the tokens: masks, then sampling
            seqs = self._ahead.seqs
            self._ahead = self._sample(self._ahead.logits, seqs, bitmask=self._grammar_bitmask(seqs))

    # -- speculative decoding -------------------------------------------------------------------------------
    def _verified(self, logits: torch.Tensor, rows, bitmask: torch.Tensor | None) -> VerifiedStep:
        """A step with sequences verifying drafts: the plain rows sampled as usual, the drafts decided (verify.py);
        all tokens on the host before the step returns."""
        seqs, runs, first_rows = [], [], []
        if rows.sample:
            plain = [seq for seq, _ in rows.sample]
            sample_rows = [row for _, row in rows.sample]
            runs += self._sample(logits[sample_rows], plain, bitmask=bitmask).runs()
            seqs += plain
            first_rows += sample_rows
        checking = VerifyRows([seq for seq, _ in rows.verify], [row for _, row in rows.verify],
                              [list(seq.spec_token_ids) for seq, _ in rows.verify])
        runs += verify(logits, checking, self._generators, self.generator, self.eos_token_ids)
        seqs += checking.seqs
        first_rows += checking.first_rows
        self.spec_stats.record(checking.drafts, runs[len(runs) - len(checking.seqs):])
        want_logprobs = any(s.params.logprobs is not None for s in seqs)
        return VerifiedStep(seqs, runs, first_rows, torch.log_softmax(logits, dim=-1) if want_logprobs else None,
                            checking.seqs)

    def _settle_verified(self, step: VerifiedStep) -> None:
        """The scheduler settles what the verifying sequences computed; a drafter that reads hidden states reads
        each one's row of its last accepted token."""
        first_rows = step.first_rows[len(step.seqs) - len(step.verified):]
        for seq, first_row, accepted in zip(step.verified, first_rows, self.scheduler.settle_verified(step.verified)):
            if not seq.is_finished:
                self._hidden_rows[seq.seq_id] = first_row + accepted

    def _draft(self, seqs: list[Sequence]) -> None:
        """Drafts for the next step, for each sequence that may take them and has more than one token to come. A
        short proposal is padded to k with its last token (verification is exact whatever is proposed), so that
        verify steps keep one shape and replay from graphs; tokens past max_tokens are dropped when taken."""
        chosen, ks = [], []
        for seq in seqs:
            room = min(self.num_speculative_tokens, self.config.max_model_len - len(seq.token_ids) - 1)
            if (room > 0 and not seq.is_finished and seq.params.max_tokens - seq.num_output_tokens > 1
                    and seq.num_uncomputed == 1 and drafting_allowed(seq) and not self.structured.is_constrained(seq)
                    and (not self.drafter.needs_hidden or seq.seq_id in self._hidden_rows)):
                chosen.append(seq)
                ks.append(room)
        if not chosen:
            return
        hidden = None
        if self.drafter.needs_hidden:
            rows = torch.tensor([self._hidden_rows[seq.seq_id] for seq in chosen], device=self.device)
            hidden = self.runner.hidden[rows]
        for seq, k, drafts in zip(chosen, ks, self.drafter.propose(chosen, hidden, ks)):
            seq.spec_token_ids = drafts + drafts[-1:] * (k - len(drafts)) if drafts else []

    def _record_prompt_logprobs(self, logits: torch.Tensor, prompt_rows) -> None:
        for seq, first_row, first_pos, count in prompt_rows:
            logprobs = torch.log_softmax(logits[first_row:first_row + count], dim=-1)
            for r in range(count):
                next_token = seq.token_ids[first_pos + r + 1]
                seq.prompt_logprobs[first_pos + r + 1] = token_logprobs(
                    logprobs[r], next_token, seq.params.prompt_logprobs)

    def _check_finished(self, seq: Sequence, token: int) -> None:
        """Token-level stops only: stop strings are found where the text is made (OutputProcessor), which then
        aborts the sequence."""
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return self._finish(seq, "stop")
        if self.structured.is_constrained(seq) and self.structured.advance(seq, token):
            return self._finish(seq, "stop")
        if seq.num_output_tokens >= params.max_tokens or len(seq.token_ids) >= self.config.max_model_len:
            return self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.images = []  # its pixels go; the encoder cache alone keeps soft tokens
        self.scheduler.remove(seq)
        self._generators.pop(seq.seq_id, None)
        self.structured.drop(seq)
        self.requests.pop(seq.request_id, None)
