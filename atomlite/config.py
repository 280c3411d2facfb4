"""Engine settings and the model description read from a checkpoint's config.json."""
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from atomlite.speculative_config import SpeculativeConfig
from atomlite.errors import ConfigError
from atomlite.generation_config import GenerationDefaults, load_generation_defaults
from atomlite.hub import config_snapshot, is_repo_id
from atomlite.model_ops.platform import Platform
from atomlite.registry import MODELS, model_class


@dataclass(frozen=True)
class LayerAttention:
    kind: str  # "sliding" | "full"
    head_dim: int
    num_kv_heads: int
    k_eq_v: bool


@dataclass(frozen=True)
class VisionSpec:
    """A checkpoint's vision tower (`hf`: its raw vision_config) and what placing images in a prompt needs: the
    tokens an image's soft tokens stand in for (image or video frame) and that open and close it (boi, eoi); the
    text config's use_bidirectional_attention ("vision": an image's tokens see each other both ways; "all"; None:
    causal); and the token id whose per-layer embedding PLE models read at soft-token rows (the pad id)."""
    hf: dict
    image_token_id: int
    video_token_id: int
    boi_token_id: int
    eoi_token_id: int
    use_bidirectional_attention: str | None
    pad_token_id: int


@dataclass(frozen=True)
class AudioSpec:
    """A checkpoint's audio tower (`hf`: its raw audio_config) and what placing a clip in a prompt needs: the token
    its soft tokens stand in for, those that open and close it (boa, eoa), and the pad id PLE models read there."""
    hf: dict
    audio_token_id: int
    boa_token_id: int
    eoa_token_id: int
    pad_token_id: int


@dataclass(frozen=True)
class ModelLayout:
    """What a model family reads from a checkpoint's config.json (its class's parse_config): the text model's config
    (`hf`, completed with the family's defaults), each layer's attention, the RoPE parameters of each layer kind,
    whether the checkpoint is multimodal, and its vision and audio towers where the family runs them."""
    hf: dict
    layers: list[LayerAttention]
    rope: dict[str, dict]
    multimodal: bool = False
    vision: VisionSpec | None = None
    audio: AudioSpec | None = None


def text_config(raw: dict) -> dict:
    """The text model's part of a multimodal config.json (its text_config, with the quantization_config such
    checkpoints keep at the top level)."""
    text = dict(raw.get("text_config") or raw)
    if "quantization_config" in raw and "quantization_config" not in text:
        text["quantization_config"] = raw["quantization_config"]
    return text


@dataclass
class ModelSpec:
    """The text model of a checkpoint, and its vision tower where it has one. `hf` keeps the raw text config for
    model-specific fields. `path` is the
    checkpoint folder; for a hub repo id, its snapshot in the Hugging Face cache (weights fetched at load)."""
    path: Path
    architecture: str
    hf: dict
    layers: list[LayerAttention]
    dtype: torch.dtype
    multimodal: bool
    repo_id: str | None = None
    vision: VisionSpec | None = None  # a multimodal checkpoint's vision tower
    rope: dict[str, dict] = field(default_factory=dict)  # layer kind -> RoPE parameters (rope_type, rope_theta, ...)
    audio: AudioSpec | None = None  # a multimodal checkpoint's audio tower

    @property
    def max_position_embeddings(self) -> int:
        return int(self.hf.get("max_position_embeddings", 8192))

    def rope_parameters(self, kind: str) -> dict:
        return self.rope[kind]

    @property
    def kv_cache_quant(self):
        """The fp8 KV cache the checkpoint was quantized for (a Quark KVCacheQuant), or None."""
        from atomlite.quant.quark import checkpoint_kv_cache
        try:
            return checkpoint_kv_cache(self.hf)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.hf.get("eos_token_id")
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} not found: --model must be a checkpoint folder with config.json") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None


def checkpoint_dtype(raw: dict, text: dict) -> torch.dtype:
    name = text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    return getattr(torch, name) if isinstance(getattr(torch, str(name), None), torch.dtype) else torch.bfloat16


def checkpoint_folder(model: str | Path) -> tuple[Path, str | None]:
    """(the folder, the hub repo id or None): a hub repo id (org/name, when no such folder exists) resolves to its
    config snapshot in the Hugging Face cache."""
    repo_id = str(model) if is_repo_id(str(model)) else None
    return (config_snapshot(repo_id) if repo_id else Path(model)), repo_id


def load_model_spec(model: str | Path) -> ModelSpec:
    """The spec of a checkpoint folder, or of a hub repo id (org/name) when no such folder exists."""
    path, repo_id = checkpoint_folder(model)
    if not path.is_dir():
        raise ConfigError(f"model folder {path} does not exist: pass a checkpoint folder or a Hugging Face hub "
                          f"repo id (org/name)")
    raw = read_json(path / "config.json")
    architectures = raw.get("architectures") or []
    arch = next((a for a in architectures if a in MODELS), None)
    if arch is None:
        raise ConfigError(
            f"{path / 'config.json'}: architecture {architectures or raw.get('model_type')} is not supported; "
            f"supported: {', '.join(MODELS)}")
    try:
        layout = model_class(arch).parse_config(raw)
    except KeyError as e:
        raise ConfigError(f"{path / 'config.json'} lacks {e.args[0]!r}") from None
    return ModelSpec(path, arch, layout.hf, layout.layers, checkpoint_dtype(raw, layout.hf), layout.multimodal,
                     repo_id, layout.vision, layout.rope, layout.audio)


SUPPORTED_QUANTIZATION = ("quark", "compressed-tensors")


def check_quantization(method: str | None, spec: ModelSpec) -> None:
    """vLLM's --quantization: the checkpoint's own method, named; atomlite quantizes nothing at load time."""
    if method is None:
        return
    own = (spec.hf.get("quantization_config") or {}).get("quant_method")
    if own is None:
        raise ConfigError(f"--quantization {method}: {spec.path} is not quantized, and atomlite does not quantize "
                          f"at load time; serve a checkpoint quantized with it (atomlite reads "
                          f"{', '.join(SUPPORTED_QUANTIZATION)}), or leave --quantization out")
    if method != own:
        raise ConfigError(f"--quantization {method} does not match the checkpoint's quantization_config "
                          f"(quant_method {own!r}): use --quantization {own}, or leave it out")


def parse_memory_size(text: str | int | None) -> int | None:
    """'20GiB', '512MiB', '1.5GB', '1000000' -> bytes."""
    if text is None or isinstance(text, int):
        return text
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9,
             "tb": 10**12, "b": 1, "": 1}
    s = str(text).strip().lower()
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number):].strip()
    if unit not in units or not number:
        raise ConfigError(f"memory size {text!r} not understood: use e.g. 20GiB, 512MiB or a number of bytes")
    return int(float(number) * units[unit])


LOAD_FORMATS = ("auto", "dummy")  # dummy: seeded random weights in the config's shapes, no safetensors read
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's --dtype also takes these
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8")
SCHEDULING_POLICIES = ("fcfs", "priority")  # auto: --dtype's; fp8: e4m3 (fnuz on gfx942)


CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY", "NONE")


def parse_compilation_config(value: dict | str | None) -> dict:
    """vLLM's --compilation-config (a dict or its JSON) -> {"cudagraph_mode": MODE} or {}; what atomlite cannot
    honour is refused with the key's name."""
    from atomlite.multimodal.options import json_object
    if value is None or value == "":
        return {}
    try:
        value = json_object(value, "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}')
    except ValueError as e:
        raise ConfigError(str(e)) from None
    unknown = sorted(set(value) - {"cudagraph_mode"})
    if unknown:
        raise ConfigError(f"--compilation-config: atomlite compiles nothing with torch.compile and honours only "
                          f"cudagraph_mode, not {', '.join(unknown)}")
    mode = value.get("cudagraph_mode")
    if mode is None:
        return {}
    if not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES:
        raise ConfigError(f"--compilation-config cudagraph_mode {mode!r} is not one of {', '.join(CUDAGRAPH_MODES)}")
    return {"cudagraph_mode": mode.upper()}


@dataclass
class EngineConfig:
    model: str
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_memory: int | str | None = None
    block_size: int | None = None  # None: the platform's (Platform.block_size)
    enable_prefix_caching: bool = True
    kernel_backend: str = "auto"
    seed: int = 0
    load_format: str = "auto"
    enforce_eager: bool = False
    max_graph_batch: int | None = None
    overlap_decode: bool = True  # launch the next decode step before reading this one's tokens
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    speculative_config: SpeculativeConfig | dict | str | None = None
    tensor_parallel_size: int = 1  # processes (GPUs) that each hold a shard of every layer
    disable_custom_all_reduce: bool = False  # all-reduce through nccl/gloo alone (no custom all-reduce)
    scheduling_policy: str = "fcfs"  # or "priority": requests' priority values order the queue (vLLM's)
    # vLLM's multimodal settings (atomlite.multimodal.options); they bound what prompts may carry
    limit_mm_per_prompt: dict | str | None = None  # {"image": 2, "video": 1}; 999 each when left out
    mm_processor_kwargs: dict | str | None = None  # the processor's settings, e.g. {"max_soft_tokens": 560}
    allowed_local_media_path: str | Path | None = None  # file:// media only under this folder
    allowed_media_domains: list[str] | tuple[str, ...] | str | None = None  # http(s) media only from these hosts
    # soft tokens the vision tower may encode in one step (vLLM's name); None: --max-num-batched-tokens
    max_num_encoder_input_tokens: int | None = None
    # the encoder cache's bound ("512MiB"); None: vLLM's encoder cache size (the larger of the encoder budget and
    # the largest image's soft tokens) at the model's width and dtype
    encoder_cache_memory: int | str | None = None
    # vLLM's: the tokenizer's folder (None: the model's); the checkpoint's quantization, checked; where sampling
    # defaults come from (atomlite.generation_config) and JSON laid over them
    tokenizer: str | None = None
    quantization: str | None = None
    generation_config: str = "auto"
    override_generation_config: dict | str | None = None
    cpu_threads: int | None = None  # torch's CPU threads in the engine; None: usable cores but one (cpu_threads.py)
    # vLLM's LoRA settings (atomlite.lora): adapters served beside the base model, batched together
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # vLLM's --compilation-config JSON; atomlite honours its cudagraph_mode (CUDAGRAPH_MODES) and refuses other keys
    compilation_config: dict | str | None = None
    model_spec: ModelSpec = field(init=False, repr=False)
    generation_defaults: GenerationDefaults = field(init=False, repr=False)

    def __post_init__(self):
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self.compilation_config = parse_compilation_config(self.compilation_config)
        if self.cudagraph_mode == "NONE":
            self.enforce_eager = True
        self.model_spec = load_model_spec(self.model)
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        self.generation_defaults = load_generation_defaults(self.model_spec.path, self.generation_config,
                                                            self.override_generation_config)
        check_quantization(self.quantization, self.model_spec)
        self.kv_cache_memory = parse_memory_size(self.kv_cache_memory)
        if self.block_size is None:
            self.block_size = Platform(self.platform_kind).block_size
        self.encoder_cache_memory = parse_memory_size(self.encoder_cache_memory)
        if self.max_num_encoder_input_tokens is None:
            self.max_num_encoder_input_tokens = self.max_num_batched_tokens
        self._parse_multimodal()
        limit = self.model_spec.max_position_embeddings
        if self.max_model_len is None:
            self.max_model_len = min(limit, 8192)
        self._check()

    @property
    def cudagraph_mode(self) -> str:
        """vLLM's cudagraph_mode: FULL_AND_PIECEWISE (its default; here decode and prefill graphs), FULL,
        PIECEWISE (the same here), FULL_DECODE_ONLY (decode graphs alone) or NONE (no graphs, --enforce-eager)."""
        return self.compilation_config.get("cudagraph_mode", "FULL_AND_PIECEWISE")

    def _parse_multimodal(self):
        from atomlite.multimodal import options
        try:
            self.limit_mm_per_prompt = options.parse_mm_limits(self.limit_mm_per_prompt)
            self.mm_processor_kwargs = options.parse_mm_processor_kwargs(self.mm_processor_kwargs,
                                                                         "--mm-processor-kwargs")
            self.allowed_local_media_path = options.parse_allowed_local_media_path(self.allowed_local_media_path)
            self.allowed_media_domains = options.parse_allowed_media_domains(self.allowed_media_domains)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # vLLM's text-only mode of a multimodal checkpoint: a tower no prompt may use is not built, loaded or profiled
        limits = self.limit_mm_per_prompt
        if self.model_spec.vision is not None and not (limits["image"] or limits["video"]):
            self.model_spec = replace(self.model_spec, vision=None)
        if self.model_spec.audio is not None and not limits["audio"]:
            self.model_spec = replace(self.model_spec, audio=None)

    def _check(self):
        limit = self.model_spec.max_position_embeddings
        if not 1 <= self.max_model_len <= limit:
            raise ConfigError(f"--max-model-len {self.max_model_len} must be between 1 and the model's "
                              f"max_position_embeddings ({limit})")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_num_encoder_input_tokens < 1:
            raise ConfigError("--max-num-seqs, --max-num-batched-tokens and --max-num-encoder-input-tokens must be "
                              "at least 1")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype} is not one of auto, {', '.join(DTYPES)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"--device {self.device} is not one of auto, cpu, cuda")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"--block-size {self.block_size} must be a power of two")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"--kv-cache-dtype {self.kv_cache_dtype} is not one of {', '.join(KV_CACHE_DTYPES)}")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"--load-format {self.load_format} is not one of {', '.join(LOAD_FORMATS)}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(f"--scheduling-policy {self.scheduling_policy} is not one of "
                              f"{', '.join(SCHEDULING_POLICIES)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"--gpu-memory-utilization {self.gpu_memory_utilization} must be in (0, 1]")
        self._check_tensor_parallel()
        if self.enable_lora:
            self.lora_config  # noqa: B018 (LoRAConfig checks the settings as it is made)
        if self.max_graph_batch is not None and self.max_graph_batch < 1:
            raise ConfigError(f"--max-graph-batch {self.max_graph_batch} must be at least 1 (or use --enforce-eager)")

    def _check_tensor_parallel(self):
        size = self.tensor_parallel_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"--tensor-parallel-size {size!r} must be an integer >= 1")
        if size == 1:
            return
        if self.device.startswith("cuda:"):
            raise ConfigError(f"--device {self.device} picks one GPU, and --tensor-parallel-size {size} puts rank r "
                              f"on GPU r: use --device cuda (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES choose the GPUs)")
        if self.device != "cpu" and torch.cuda.is_available() and torch.cuda.device_count() < size:
            raise ConfigError(f"--tensor-parallel-size {size} needs {size} GPUs; {torch.cuda.device_count()} are "
                              f"visible")
        spec = self.speculative_config
        if spec is not None and spec.method == "mtp":
            raise ConfigError("speculative_config method 'mtp' does not run under tensor parallelism yet: use "
                              "method 'ngram', or --tensor-parallel-size 1")

    def check_priority(self, priority: int) -> None:
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(f"Got priority {priority} but Priority scheduling is not enabled (start with "
                             f"--scheduling-policy priority)")

    @property
    def lora_config(self):
        from atomlite.lora.config import LoRAConfig
        return LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)

    @property
    def tokenizer_path(self) -> Path:
        """The folder the tokenizer loads from: --tokenizer's, else the model's."""
        if self.tokenizer is None:
            return self.model_spec.path
        path, _ = checkpoint_folder(self.tokenizer)
        if not path.is_dir():
            raise ConfigError(f"--tokenizer {self.tokenizer}: no such folder (give a folder with tokenizer.json or "
                              f"tokenizer_config.json, or a hub repo id already in the cache)")
        return path

    @property
    def platform_kind(self) -> str:
        """cpu, cuda or rocm: what --device picks, without asking the GPU anything."""
        if self.device == "cpu" or not torch.cuda.is_available():
            return "cpu"
        return "rocm" if torch.version.hip else "cuda"

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for but no GPU is visible; use --device cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.model_spec.dtype if self.dtype == "auto" else DTYPES[self.dtype]

    def kv_dtype(self, platform) -> torch.dtype:
        """What the KV cache stores on platform (a model_ops Platform). auto: fp8 for a checkpoint quantized for an
        fp8 KV cache (where the platform has e4m3), else --dtype."""
        if self.kv_cache_dtype == "auto":
            fp8 = self.model_spec.kv_cache_quant is not None and platform.has_fp8
            return platform.fp8_dtype if fp8 else self.torch_dtype
        if self.kv_cache_dtype != "fp8":
            return DTYPES[self.kv_cache_dtype]
        if not platform.has_fp8:
            raise ConfigError(f"--kv-cache-dtype fp8 needs e4m3 support (NVIDIA sm_89 or newer, AMD gfx942 / gfx950), "
                              f"which {platform.describe()} lacks: use --kv-cache-dtype auto")
        return platform.fp8_dtype
