"""The offline API, shaped like vLLM's: LLM(model=...).generate(prompts, sampling_params)."""
import dataclasses
import itertools

from tqdm import tqdm

from atomlite.chat_template import render_chat
from atomlite.chat_text import ContentGuard
from atomlite.config import EngineConfig
from atomlite.engine.llm_engine import LLMEngine
from atomlite.engine.output_processor import OutputProcessor
from atomlite.engine.sampling.structured import check_structured_outputs
from atomlite.lora.request import LoRARequest
from atomlite.multimodal.inputs import MultiModalPrompt
from atomlite.multimodal.offline import OfflineMultiModal
from atomlite.outputs import RequestOutput
from atomlite.sampling_params import SamplingParams


class LLM:
    """Load a checkpoint folder (or a Hugging Face hub repo id, resolved through the hub cache) and generate from it.

    LLM(model=DIR, dtype="auto"|"float32"|"bfloat16"|"float16", device="auto"|"cpu"|"cuda",
        max_model_len=None, max_num_seqs=64, max_num_batched_tokens=2048, kv_cache_memory=None ("20GiB"),
        kernel_backend="auto"|"triton"|"torch", enable_prefix_caching=True, block_size=None (64 on NVIDIA GPUs,
        else 16), seed=0,
        load_format="auto"|"dummy", enforce_eager=False, max_graph_batch=None, gpu_memory_utilization=0.9,
        compilation_config=None ({"cudagraph_mode": "FULL_DECODE_ONLY"}),
        limit_mm_per_prompt=None ({"image": 2}), mm_processor_kwargs=None ({"max_soft_tokens": 560}),
        allowed_local_media_path=None, allowed_media_domains=None,
        enable_lora=False, max_loras=1, max_lora_rank=16, max_cpu_loras=None)
    """

    def __init__(self, model: str, **engine_args):
        self.engine = LLMEngine(EngineConfig(model=str(model), **engine_args))
        self._ids = itertools.count()
        self._multimodal = OfflineMultiModal(self.engine.config, self.engine.tokenizer)
        self._guard: ContentGuard | None = None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | dict | list[str] | list[int] | list[list[int]] | list[dict],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False, priority: list[int] | None = None,
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in the order given. A prompt is text, token ids, or vLLM's dict:
        {"prompt": text} or {"prompt_token_ids": ids}, with "multi_modal_data": {"image": an image or a list,
        "video": frames, or a list of videos, "audio": (samples, sample_rate) or a list of them} and
        "mm_processor_kwargs". priority: one per prompt, with scheduling_policy="priority" (lower runs first).
        lora_request: the LoRA adapter every prompt runs with, or one per prompt (None: the base model), with
        enable_lora=True."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        inputs = [self._multimodal.prompt_dict(p) if isinstance(p, dict) else (p, None) for p in prompts]
        return self._generate(inputs, sampling_params, use_tqdm, priority, lora_request)

    def _generate(self, inputs: list[tuple[str | list[int], MultiModalPrompt | None]],
                  sampling_params: SamplingParams | list[SamplingParams] | None,
                  use_tqdm: bool, priority: list[int] | None = None,
                  lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        prompts = [prompt for prompt, _ in inputs]
        params = sampling_params or self.get_default_sampling_params()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        priority = [0] * len(prompts) if priority is None else priority
        if len(priority) != len(prompts):
            raise ValueError(f"{len(priority)} priorities for {len(prompts)} prompts")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(loras)} LoRA requests for {len(prompts)} prompts")
        if self.engine.served():
            raise RuntimeError("this LLM's engine is served by a running server (an engine client's core thread "
                               "steps it); generate with another LLM, or shut the server down first")
        processor, states = OutputProcessor(self.tokenizer), []
        try:
            for (prompt, multimodal), p, rank, lora in zip(inputs, params, priority, loras):
                request_id = f"offline-{next(self._ids)}"
                for j, child in enumerate(_children(p)):
                    seq = self._add_request(f"{request_id}-{j}" if p.n > 1 else request_id, prompt, multimodal, child,
                                            rank, lora)
                    states.append(processor.add(seq.request_id, seq.prompt_token_ids, child))
            with tqdm(total=len(states), desc="Generating", disable=not use_tqdm) as bar:
                while self.engine.has_unfinished():
                    bar.update(self._step(processor))
        except BaseException:
            for state in states:
                self.engine.abort(state.request_id)
            raise
        return _request_outputs(states, prompts, params)

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: SamplingParams with the checkpoint's generation_config.json defaults (generation_config="vllm"
        leaves them out), what generate and chat use when given none."""
        return SamplingParams(**self.engine.config.generation_defaults.sampling)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = False,
             chat_template: str | None = None, add_generation_prompt: bool = True, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None, continue_final_message: bool = False,
             trust_request_chat_template: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of OpenAI-shaped messages) or several, rendered with the chat
        template (the tokenizer's, or chat_template), tools and chat_template_kwargs reaching it as variables
        (continue_final_message=True with add_generation_prompt=False continues the last message instead);
        one RequestOutput per conversation, its text the model's raw output. Image and video parts (image_url,
        video_url) are read under the engine config's media policy (data: URLs always).

        As the server: the messages', tools' and kwargs' strings are text, so a special token's text typed in them
        (a user's `<start_of_turn>`) stays text, never a forged turn, and chat_template_kwargs that name special
        tokens (bos_token, ...) are refused; trust_request_chat_template=True (the server's
        --trust-request-chat-template) lets them be template structure."""
        if self.tokenizer is None:
            raise ValueError("chat needs the model's tokenizer, and this model has none; use generate with token ids")
        guard = None if trust_request_chat_template else self._content_guard()
        if guard is not None:
            named = guard.structure_kwargs(chat_template_kwargs or {})
            if named:
                raise ValueError(f"chat_template_kwargs may not set {named}: they name the chat template's special "
                                 f"tokens (pass trust_request_chat_template=True to allow it)")
        if continue_final_message:  # vLLM's: the last message is continued (a prefill), not answered
            if add_generation_prompt:
                raise ValueError("continue_final_message needs add_generation_prompt=False")
            chat_template_kwargs = {**(chat_template_kwargs or {}), "continue_final_message": True}
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if guard is not None:
            conversations, tools, chat_template_kwargs = map(guard.mark, (conversations, tools, chat_template_kwargs))
        inputs = []
        for conversation in conversations:
            multimodal = self._multimodal.chat(conversation, tools, chat_template, chat_template_kwargs,
                                               add_generation_prompt, guard)
            ids = multimodal.prompt_token_ids if multimodal is not None else render_chat(
                self.tokenizer, conversation, tools, chat_template, chat_template_kwargs, add_generation_prompt,
                guard.encode if guard is not None else None)
            inputs.append((ids, multimodal))
        return self._generate(inputs, sampling_params, use_tqdm)

    def _content_guard(self) -> ContentGuard:
        if self._guard is None:
            self._guard = ContentGuard(self.tokenizer)
        return self._guard

    def _add_request(self, request_id: str, prompt: str | list[int], multimodal: MultiModalPrompt | None,
                     params: SamplingParams, priority: int = 0, lora: LoRARequest | None = None):
        """The one place a prompt is handed to the engine."""
        if params.structured_outputs is not None:
            check_structured_outputs(params.structured_outputs)  # a bad spec raises here, not in a later step
        if multimodal is not None:
            return self.engine.add_request(request_id, multimodal.prompt_token_ids, params, priority, multimodal,
                                           lora_request=lora)
        return self.engine.add_request(request_id, prompt, params, priority, lora_request=lora)

    def _step(self, processor: OutputProcessor) -> int:
        """One engine step, its updates into their requests; returns how many finished."""
        step = processor.process(self.engine.step())
        for request_id in step.stopped:
            self.engine.abort(request_id)
        return step.num_finished


def _children(params: SamplingParams) -> list[SamplingParams]:
    """The n sequences of one prompt, as vLLM makes them: one each, the j-th seeded with seed + j."""
    if params.n == 1:
        return [params]
    return [dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + j)
            for j in range(params.n)]


def _request_outputs(states: list, prompts: list, params: list[SamplingParams]) -> list[RequestOutput]:
    """One RequestOutput per prompt, its n completions in order."""
    outputs, states = [], iter(states)
    for prompt, p in zip(prompts, params):
        children = [next(states) for _ in range(p.n)]
        out = children[0].output(prompt if isinstance(prompt, str) else None)
        out.request_id = out.request_id.rsplit("-", 1)[0] if p.n > 1 else out.request_id
        out.outputs = [child.completion(j) for j, child in enumerate(children)]
        out.finished = all(child.finished for child in children)
        outputs.append(out)
    return outputs
