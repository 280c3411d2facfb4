"""Turns a scheduled batch into one forward pass, eager or replayed from a decode or prefill graph (its inputs built
one way for all: step_inputs), then the logits of just the rows that need them. Under tensor parallelism rank 0's
runner sends each step's inputs to the other ranks' runners, which run the same forward on their shards (follow)."""
import contextlib
from dataclasses import dataclass, field

import torch

from atomlite.distributed import TensorParallel
from atomlite.distributed.parallel import SINGLE
from atomlite.engine.runner.decode_graphs import DecodeGraphs
from atomlite.engine.runner.prefill_graphs import PrefillGraphs
from atomlite.engine.images.image_embeds import ImageEmbedder, SoftTokenRows
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.sequence import Sequence
from atomlite.engine.runner.step_inputs import StepInputBuilder, StepInputs, step_metadata_by_group
from atomlite.model_ops.multimodal import MultiModalEmbeds

DECODE, VERIFY, PREFILL = 0, 1, 2  # which graphs replay a step (RunnerStep.graphs)


@dataclass
class StepRows:
    """Which logit rows belong to whom: one sampling row per finishing-prefill/decoding sequence; k + 1 rows per
    sequence verifying k drafts (its newest token's, then each draft's); and a run of rows per sequence that wants
    prompt logprobs (row r scores the prompt token after position r)."""
    sample: list[tuple[Sequence, int]]
    prompt: list[tuple[Sequence, int, int, int]]  # (seq, first row, first position, count)
    indices: list[int]
    verify: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, first of its k + 1 rows)


def _rows(batch: list[tuple[Sequence, int]]) -> StepRows:
    sample, prompt, verify, indices, offset = [], [], [], [], 0
    for seq, num_new in batch:
        start = seq.num_computed_tokens
        if seq.params.prompt_logprobs is not None:
            count = max(0, min(start + num_new, seq.num_prompt_tokens - 1) - start)
            if count:
                prompt.append((seq, len(indices), start, count))
                indices.extend(range(offset, offset + count))
        drafts = len(seq.spec_token_ids)
        if drafts and start + num_new == len(seq.token_ids) + drafts:
            verify.append((seq, len(indices)))
            indices.extend(range(offset + num_new - drafts - 1, offset + num_new))
        elif start + num_new == len(seq.token_ids):
            sample.append((seq, len(indices)))
            indices.append(offset + num_new - 1)
        offset += num_new
    return StepRows(sample, prompt, indices, verify)


@dataclass
class RunnerStep:
    """One forward pass as every rank runs it: its inputs; the graphs that replay it (DECODE, VERIFY: their logits
    are the step's rows; inputs.ids None: the input ids are on rank 0's device, sampled by the step before; PREFILL)
    or None (eager); the rows whose logits it computes (eager and PREFILL); which of its rows are image soft tokens
    (their values follow by a broadcast from rank 0, the one rank that encodes); and the LoRA adapters each rank
    loads into its slots first ((slot, LoRARequest))."""
    inputs: StepInputs
    graphs: int | None = None
    indices: list[int] = field(default_factory=list)
    soft_tokens: SoftTokenRows | None = None
    lora_loads: list = field(default_factory=list)


class ModelRunner:
    def __init__(self, model, kv: KVCacheManager, device: torch.device, tp: TensorParallel = SINGLE):
        self.model, self.kv, self.device, self.tp = model, kv, device, tp
        self.followers = None  # rank 0 of several: where each step goes to the other ranks (engine/runner/workers.py)
        for layer, attn in enumerate(model.attention_layers()):
            attn.bind_cache(*kv.cache_for_layer(layer))
        # a model whose layers let an image's soft tokens see each other both ways says so
        self.inputs = StepInputBuilder(kv, device, step_metadata_by_group(model.attention_layers()),
                                       getattr(model, "image_spans_bidirectional", False))
        self.images: ImageEmbedder | None = None  # rank 0 of a model with a vision tower: encodes the steps' images
        self.graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.keep_hidden = False  # a drafter reads the target's hidden states: keep the rows of the last step
        self.hidden: torch.Tensor | None = None  # [rows, hidden] of the last step, aligned with its logits' rows
        # forward passes since start by how they ran: "graph" (replayed from a captured graph) or "eager"
        self.forward_passes = {"graph": 0, "eager": 0}
        self.lora = None  # this rank's AdapterSlots (atomlite.lora) when the engine serves adapters
        self.lora_loads: list = []  # (slot, LoRARequest) the next step loads on every rank

    def use_decode_graphs(self, max_batch: int, max_model_len: int, capture: bool = True) -> DecodeGraphs:
        """Decode-only steps of up to max_batch sequences run from static buffers (graphs when capture)."""
        self.graphs = DecodeGraphs(self.model, self.inputs, max_batch, max_model_len, capture, self.keep_hidden)
        if capture:
            with self.tp.capturing():
                self.graphs.capture_all()
        return self.graphs

    def use_verify_graphs(self, num_drafts: int, max_batch: int, max_model_len: int,
                          capture: bool = True) -> DecodeGraphs:
        """Steps of up to max_batch sequences that each verify num_drafts drafts, from their own graphs."""
        self.verify_graphs = DecodeGraphs(self.model, self.inputs, max_batch, max_model_len, capture,
                                          self.keep_hidden, queries_per_seq=num_drafts + 1)
        if capture:
            with self.tp.capturing():
                self.verify_graphs.capture_all()
        return self.verify_graphs

    def use_prefill_graphs(self, max_tokens: int, max_seqs: int, max_model_len: int,
                           capture: bool = True) -> PrefillGraphs:
        """Other steps of up to max_tokens new tokens of up to max_seqs sequences, without soft tokens, run from
        static buffers (graphs when capture)."""
        self.prefill_graphs = PrefillGraphs(self.model, self.inputs, max_tokens, max_seqs, max_model_len, capture)
        if capture:
            with self.tp.capturing():
                self.prefill_graphs.capture_all()
        return self.prefill_graphs

    @contextlib.contextmanager
    def eager_prefills(self):
        """Prefill and mixed steps run eager inside (warm-up compiles the eager path's kernels; a forward hook sees
        each step, which a graph replay never calls)."""
        graphs, self.prefill_graphs = self.prefill_graphs, None
        try:
            yield
        finally:
            self.prefill_graphs = graphs

    def release_graphs(self) -> None:
        """Drops the captured graphs (before the collectives they captured go away), then the custom all-reduce's
        buffers: at close."""
        self.graphs = self.verify_graphs = self.prefill_graphs = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self.tp.close_peers()

    def can_run_ahead(self, num_seqs: int) -> bool:
        """Whether a decode step of num_seqs sequences can run before the host has its input ids."""
        return self.graphs is not None and self.graphs.fits(num_seqs)

    @torch.inference_mode()
    def execute_ahead(self, seqs: list[Sequence], ids: torch.Tensor) -> torch.Tensor:
        """-> fp32 logits [len(seqs), vocab] of a decode step whose input ids (one per sequence, on the device) the
        step before sampled and the host has not read: each sequence's token at position num_computed_tokens."""
        inputs = self.inputs.build([(seq, 1) for seq in seqs], ids_known=False)
        return self._replay(RunnerStep(inputs, DECODE, lora_loads=self._take_lora_loads()), ids)

    @torch.inference_mode()
    def execute(self, batch: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, StepRows]:
        """-> fp32 logits of the needed rows, and which rows they are."""
        rows = _rows(batch)
        soft_tokens = self.images.step_soft_tokens(batch) if self.images is not None else None
        which = next((i for i, g in enumerate((self.graphs, self.verify_graphs))
                      if g is not None and g.supports(batch)), None) if soft_tokens is None else None
        inputs, loads = self.inputs.build(batch), self._take_lora_loads()
        if which is not None:
            return self._replay(RunnerStep(inputs, which, lora_loads=loads)), rows
        if soft_tokens is None and self.prefill_graphs is not None and self.prefill_graphs.supports(batch):
            return self._prefill(RunnerStep(inputs, PREFILL, indices=rows.indices, lora_loads=loads)), rows
        if soft_tokens is None:
            return self._eager(RunnerStep(inputs, indices=rows.indices, lora_loads=loads)), rows
        positions, values = soft_tokens
        step = RunnerStep(inputs, indices=rows.indices, lora_loads=loads,
                          soft_tokens=SoftTokenRows(positions, values.shape[1], values.dtype))
        return self._eager(step, values), rows

    @torch.inference_mode()
    def follow(self, step: RunnerStep) -> None:
        """A rank other than 0: its shards' part of rank 0's step (whose collectives join them)."""
        if step.graphs is None:
            self._eager(step)
        elif step.graphs == PREFILL:
            self._prefill(step)
        elif step.inputs.ids is not None:
            self._replay(step)
        else:  # a step launched ahead: its ids come from rank 0 (_replay's broadcast)
            self._replay(step, torch.empty(step.inputs.num_seqs, dtype=torch.int64, device=self.device))

    def _replay(self, step: RunnerStep, ids: torch.Tensor | None = None) -> torch.Tensor:
        self._send(step)
        self._set_adapters(step)
        if step.inputs.ids is not None:
            ids = None
        elif self.tp.size > 1:
            ids = self.tp.broadcast(ids)  # rank 0 sampled them on its device: every rank reads them from there
        graphs = (self.graphs, self.verify_graphs)[step.graphs]
        self.forward_passes["graph" if graphs.capture else "eager"] += 1
        logits = graphs.run(step.inputs, ids)
        self.hidden = graphs.hidden[:len(logits)] if self.keep_hidden else None
        return logits

    def _eager(self, step: RunnerStep, soft_token_values: torch.Tensor | None = None) -> torch.Tensor:
        self._send(step)
        self._set_adapters(step)
        self.forward_passes["eager"] += 1
        ids, ctx = self.inputs.context(step.inputs)
        if step.soft_tokens is None:
            hidden = self.model(ids, ctx)
        else:
            hidden = self.model(ids, ctx, self._soft_token_embeds(step.soft_tokens, soft_token_values))
        return self._logits(hidden, step.indices)

    def _prefill(self, step: RunnerStep) -> torch.Tensor:
        self._send(step)
        self._set_adapters(step)
        self.forward_passes["graph" if self.prefill_graphs.capture else "eager"] += 1
        return self._logits(self.prefill_graphs.run(step.inputs), step.indices)

    def _logits(self, hidden: torch.Tensor, indices: list[int]) -> torch.Tensor:
        """fp32 logits of the hidden rows at indices (and those rows kept for a drafter)."""
        if not indices:
            return torch.empty(0)
        selected = self._rows_at(hidden, indices)
        self.hidden = selected.clone() if self.keep_hidden else None  # a slice may alias a graph's output
        return self.model.compute_logits(selected).float()

    def _rows_at(self, hidden: torch.Tensor, indices: list[int]) -> torch.Tensor:
        """hidden's rows at indices, without waiting for the forward: the host goes on to launch the sampling and
        do the step's bookkeeping while the GPU runs (a pageable index copy would block it until the forward
        ends). Consecutive rows (a lone prompt's last, a decode batch) are a slice."""
        first = indices[0]
        if indices[-1] - first == len(indices) - 1 and indices == list(range(first, first + len(indices))):
            return hidden[first:first + len(indices)]
        index = torch.tensor(indices, dtype=torch.int64)
        if self.device.type == "cuda":
            index = index.pin_memory()
        return hidden[index.to(self.device, non_blocking=True)]

    def _soft_token_embeds(self, rows: SoftTokenRows, values: torch.Tensor | None) -> MultiModalEmbeds:
        """The step's soft tokens on this rank: rank 0 encoded them (values), the other ranks receive them."""
        if values is None:
            values = torch.empty(len(rows.positions), rows.width, dtype=rows.dtype, device=self.device)
        values = self.tp.broadcast(values.contiguous())
        return MultiModalEmbeds(torch.from_numpy(rows.positions).to(self.device), values)

    def _take_lora_loads(self) -> list:
        loads, self.lora_loads = self.lora_loads, []
        return loads

    def _set_adapters(self, step: RunnerStep) -> None:
        """The step's adapter loads into this rank's slots, then each row's slot (a graph reads it from the same
        buffer)."""
        if self.lora is None:
            return
        for slot, request in step.lora_loads:
            self.lora.load(slot, request)
        self.lora.fill_rows(step.inputs.lora_slots)

    def _send(self, step: RunnerStep) -> None:
        if self.followers is not None:
            self.followers.send(step)
