"""What each tensor-parallel rank holds, built alike on every rank: its shard of the model, a KV cache of the same
blocks as every other rank's, the runner and its decode graphs. A single-GPU engine is rank 0 of 1. Rank 0's
LLMEngine schedules and samples; the other ranks' runners follow its steps (engine/runner/workers.py)."""
import logging
import functools

import torch

from atomlite import distributed
from atomlite.config import EngineConfig
from atomlite.distributed import TensorParallel
from atomlite.model_ops.peer_memory import with_custom_all_reduce
from atomlite.engine.runner.decode_graphs import graphs_off_reason, verify_graphs_off_reason
from atomlite.engine.images.encoder_cache import encoder_cache_bytes
from atomlite.engine.images.image_embeds import largest_step_audio, largest_step_images, longest_clip
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.kv.kv_planner import KVPlan, budget_for, plan_kv_cache
from atomlite.engine.kv.kv_scales import apply_kv_scales
from atomlite.engine.kv.memory_profile import MemoryProfile, profile_memory
from atomlite.engine.runner.model_runner import ModelRunner
from atomlite.engine.spec.drafters import build_drafter
from atomlite.errors import ConfigError
from atomlite.hub import fetch_weights
from atomlite.loader import load_dummy_weights, load_weights, resolve
from atomlite.model_ops import dispatch
from atomlite.model_ops.dispatch import KernelChoices
from atomlite.model_ops.fusion import link
from atomlite.model_ops.mxfp4_linear import make_row_copies
from atomlite.model_ops.platform import Platform, detect_platform
from atomlite.models.construction import default_dtype
from atomlite.registry import model_class, mtp_assistant

logger = logging.getLogger("atomlite")
CPU_DEFAULT_KV_BYTES = 2 * 2**30


def construct_model(config: EngineConfig, device: torch.device | str, platform: Platform,
                    kernels: KernelChoices | None = None):
    """The model's modules for config, on device (meta: no memory), with kernels chosen for platform (and recorded
    in `kernels` when given); the shards of the enclosing distributed.use block's rank."""
    spec = config.model_spec
    with (dispatch.use(platform, config.kernel_backend, kernels), torch.device(device),
          default_dtype(config.torch_dtype)):
        return link(model_class(spec.architecture)(spec, max_positions=config.max_model_len))


def build_model(config: EngineConfig, kernels: KernelChoices | None = None):
    device = config.torch_device
    model = construct_model(config, device, detect_platform(device), kernels)
    if config.load_format == "dummy":
        load_dummy_weights(model, config.seed)
    else:
        load_checkpoint(model, config.model_spec)
    model.row_copy_note = make_row_copies(model, copy_budget(config, device))
    return model.eval()


def copy_budget(config: EngineConfig, device: torch.device) -> int | None:
    """What load-time weight copies may take on a GPU: half of what --gpu-memory-utilization leaves beside the
    weights (less --kv-cache-memory where given), the other half for the KV cache, activations, graphs and what
    loads after the model; None (no limit) elsewhere."""
    if torch.device(device).type != "cuda":
        return None
    usable = config.gpu_memory_utilization * torch.cuda.get_device_properties(device).total_memory
    left = usable - torch.cuda.memory_allocated(device) - (config.kv_cache_memory or 0)
    return max(0, int(left) // 2)


def assistant_spec_for(config: EngineConfig):
    """The MTP assistant's spec of config.speculative_config, checked against the model's config.json (so that a
    wrong assistant fails before any weight loads); None for other drafters."""
    spec = config.speculative_config
    if spec is None or spec.method != "mtp":
        return None
    drafter = mtp_assistant(config.model_spec.architecture)
    assistant = drafter.load_assistant_spec(spec.model)
    drafter.check_compatible(assistant, config.model_spec)
    return assistant


def build_assistant_for(config: EngineConfig, assistant_spec, target, kernels: KernelChoices | None = None):
    """The MTP assistant built beside target (its KV read from target's cache); None without one."""
    if assistant_spec is None:
        return None
    build = mtp_assistant(config.model_spec.architecture).build_assistant
    device = config.torch_device
    with dispatch.use(detect_platform(device), config.kernel_backend, kernels):
        return build(assistant_spec, target, device, config.torch_dtype, config.load_format, config.seed)


def load_checkpoint(model, spec) -> None:
    """The checkpoint's weights into model; for a hub repo id, its shards are fetched into the hub cache first."""
    if spec.repo_id is not None:
        fetch_weights(spec.repo_id, spec.path, lambda name: resolve(model, name) is not None)
    load_weights(model, spec.path)


def plan_for(config: EngineConfig, specs) -> KVPlan:
    """--kv-cache-memory's plan; on CPU without it, room for max_num_seqs full sequences, at most
    CPU_DEFAULT_KV_BYTES but at least one sequence."""
    if config.kv_cache_memory is not None:
        return plan_kv_cache(specs, config.kv_cache_memory, config.block_size, config.max_model_len)
    size = functools.partial(budget_for, specs, config.block_size, config.max_model_len)
    budget = max(min(size(config.max_num_seqs), CPU_DEFAULT_KV_BYTES), size(1))
    return plan_kv_cache(specs, budget, config.block_size, config.max_model_len)


class EngineRank:
    def __init__(self, config: EngineConfig, tp: TensorParallel = distributed.parallel.SINGLE):
        self.device = config.torch_device
        self.kernels = KernelChoices()
        self.all_reduce_note = ""
        if tp.size > 1:
            with dispatch.use(detect_platform(self.device), config.kernel_backend, self.kernels):
                tp, self.all_reduce_note = with_custom_all_reduce(tp, self.device,
                                                                   config.disable_custom_all_reduce)
        self.config, self.tp = config, tp
        assistant_spec = assistant_spec_for(config)
        with distributed.use(tp):
            self.model = build_model(config, self.kernels)
        self.loras = self._attach_adapter_slots() if config.enable_lora else None
        self.assistant = build_assistant_for(config, assistant_spec, self.model, self.kernels)
        cache_dtype = config.kv_dtype(detect_platform(self.device))
        self.kv_specs = specs = self.model.kv_specs(cache_dtype)
        self.kv_scales_note = apply_kv_scales(self.model, specs, config.model_spec.kv_cache_quant, cache_dtype)
        self.memory: MemoryProfile | None = None
        if config.kv_cache_memory is None and self.device.type == "cuda":
            self.memory = profile_memory(self.model, specs, self.device, config.gpu_memory_utilization,
                                         min(config.max_num_batched_tokens, config.max_model_len),
                                         self._graph_tokens(), config.block_size, *self._image_profile(),
                                         encoder_graphs=self.image_graphs_off() is None,
                                         step_audio=self._audio_profile(),
                                         audio_graphs=self.audio_graphs_off() is None,
                                         prefill_graphs=self.prefill_graphs_off() is None)
            self.kv_plan = self._plan_from_profile(specs)
        else:
            self.kv_plan = plan_for(config, specs)
        self.kv = KVCacheManager(specs, self.kv_plan.num_pages, config.block_size, self.device,
                                 config.enable_prefix_caching)
        self.runner = ModelRunner(self.model, self.kv, self.device, tp)
        self.runner.lora = self.loras
        spec = config.speculative_config
        self.drafter = build_drafter(spec, self.assistant, self.kv, self.device)
        self.num_speculative_tokens = spec.num_speculative_tokens if spec else 0
        self.runner.keep_hidden = self.drafter is not None and self.drafter.needs_hidden
        self.graph_note = self._set_up_decode_graphs()
        for note in (self._set_up_prefill_graphs(), self._set_up_image_graphs(), self._set_up_audio_graphs()):
            if note:
                self.graph_note += f"; {note}"

    def _attach_adapter_slots(self):
        """LoRA slots on the model's target projections (before the memory profile, which counts them, and the
        graphs, which read them)."""
        from atomlite.lora.slots import AdapterSlots
        config = self.config
        rows = max(config.max_num_batched_tokens, self._graph_tokens())
        with (dispatch.use(detect_platform(self.device), config.kernel_backend, self.kernels),
              torch.device(self.device), default_dtype(config.torch_dtype)):
            return AdapterSlots(self.model, config.lora_config, rows, self.device)

    def _image_profile(self) -> tuple[tuple[list, list] | None, int]:
        """For a model with a tower: the largest step's images (None without a vision tower), and the encoder
        cache's bytes."""
        config = self.config
        cache = encoder_cache_bytes(config) if getattr(self.model, "encoder_placeholders", None) else 0
        vision = getattr(self.model, "vision_spec", None)
        if vision is None:
            return None, cache
        images = largest_step_images(vision.hf, config.max_num_batched_tokens, config.max_num_encoder_input_tokens)
        return images, cache

    def _audio_profile(self) -> list | None:
        """For a model with an audio tower: the largest step's clips."""
        if getattr(self.model, "audio_spec", None) is None:
            return None
        return largest_step_audio(self.config.max_num_batched_tokens, self.config.max_num_encoder_input_tokens)

    def _plan_from_profile(self, specs) -> KVPlan:
        """The KV plan of the memory profile's budget: the smallest rank's, so that every rank holds the same
        blocks."""
        config = self.config
        budget = self.tp.min_over_ranks(max(self.memory.kv_budget, 0), self.device)
        try:
            return plan_kv_cache(specs, budget, config.block_size, config.max_model_len)
        except ConfigError as e:
            raise ConfigError(f"{self.memory.describe()}: {e}; or raise --gpu-memory-utilization, lower "
                              f"--max-num-batched-tokens") from None

    def graphs_off(self) -> str | None:
        return graphs_off_reason(self.device, self.config.enforce_eager, self.kernels)

    def graph_batch(self) -> int:
        """The largest decode batch replayed from a graph; 0 when decode runs eager."""
        config = self.config
        if self.graphs_off() is not None:
            return 0
        return min(config.max_graph_batch or config.max_num_seqs, config.max_num_seqs, config.max_num_batched_tokens)

    def _graph_tokens(self) -> int:
        """The tokens whose activations the graph pools hold: the largest decode batch's, and with drafts also a
        verify step's (k + 1 per sequence), profiled as one batch of that many tokens."""
        spec = self.config.speculative_config
        return self.graph_batch() * (1 if spec is None else spec.num_speculative_tokens + 2)

    def prefill_graphs_off(self) -> str | None:
        """Why prefill and mixed steps run eager (None when they replay graphs; "" when no step does, which the
        decode graphs' line says)."""
        if self.graphs_off() is not None:
            return ""
        if self.config.cudagraph_mode == "FULL_DECODE_ONLY":
            return "off (--compilation-config cudagraph_mode FULL_DECODE_ONLY)"
        if self.config.enable_lora:
            return "off (LoRA adapters: each row's slot is not in a prefill graph's buffers)"
        unable = verify_graphs_off_reason(self.model)
        return f"off ({unable})" if unable else None

    def _set_up_prefill_graphs(self) -> str:
        off = self.prefill_graphs_off()
        if off is not None:
            return f"prefill graphs: {off}" if off else ""
        config = self.config
        graphs = self.runner.use_prefill_graphs(config.max_num_batched_tokens, config.max_num_seqs,
                                                config.max_model_len)
        return graphs.report.describe()

    def image_graphs_off(self) -> str | None:
        """Why the vision tower encodes eager (None when it replays graphs; "" for a model without a tower)."""
        if getattr(self.model, "vision_spec", None) is None or self.tp.rank != 0:
            return ""  # rank 0 alone encodes
        reason = self.model.image_graphs_off_reason()
        return self.graphs_off() or (f"off ({reason})" if reason else None)

    def _set_up_image_graphs(self) -> str:
        off = self.image_graphs_off()
        if off is None:
            return self.model.use_image_graphs(self.config.max_num_encoder_input_tokens).report.describe()
        return f"vision tower graphs: {off}" if off else ""

    def audio_graphs_off(self) -> str | None:
        """Why the audio tower encodes eager (None when it replays graphs; "" for a model without one)."""
        if getattr(self.model, "audio_spec", None) is None or self.tp.rank != 0:
            return ""  # rank 0 alone encodes
        return self.graphs_off()

    def _set_up_audio_graphs(self) -> str:
        off = self.audio_graphs_off()
        if off is None:
            longest = longest_clip(self.config.max_num_batched_tokens, self.config.max_num_encoder_input_tokens)
            return self.model.use_audio_graphs(longest).report.describe()
        return f"audio tower graphs: {off}" if off else ""

    def _set_up_decode_graphs(self) -> str:
        """Captures decode graphs where they can run; returns the startup line that says what happened."""
        off = self.graphs_off()
        if off is None:
            note = self.runner.use_decode_graphs(self.graph_batch(), self.config.max_model_len).report.describe()
            k = self.num_speculative_tokens
            verify_batch = min(self.graph_batch(), self.config.max_num_batched_tokens // (k + 1))
            verify_off = verify_graphs_off_reason(self.model)
            if self.drafter is not None and verify_off is not None:
                note += f"; verify steps run eager: {verify_off}"
            elif self.drafter is not None and verify_batch:
                verify = self.runner.use_verify_graphs(k, verify_batch, self.config.max_model_len).report
                note += f"; verify steps ({k} drafts per sequence): {verify.describe().removeprefix('decode graphs: ')}"
            if hasattr(self.drafter, "use_graphs"):
                drafts = self.drafter.use_graphs(self.graph_batch(), self.config.max_model_len, k).report
                note += f"; draft steps: {drafts.describe().removeprefix('decode graphs: ')}"
            return note
        note = f"decode graphs: {off}"
        if self.device.type == "cuda" and not self.config.enforce_eager and self.tp.rank == 0:
            logger.warning(note)  # a GPU decoding eager though nobody asked for it: slower, and the user should know
        return note
