"""AMD AITER kernels behind torch_ref's op signatures (ROCm gfx942 / gfx950 only; `import aiter` happens lazily, on
the first kernel call or availability check on such a machine, never on CPU or CUDA).

limits() answers from the shape, the platform's arch and which AITER functions exist (the real module on this
machine, the pinned signatures for a hand-made Platform), so dispatch falls to Triton/torch with the reason.
Not served here (no AITER entry in OPS): rope (AITER's RoPE takes positions and its own cos/sin cache layout, not
per-token cos/sin) and moe_experts (fused_moe wants pre-shuffled weights and has no gelu_tanh gate).
"""
from atomlite.model_ops.aiter import detect
from atomlite.model_ops.aiter.attention import paged_attention, write_kv
from atomlite.model_ops.aiter.functions import REQUIRED
from atomlite.model_ops.aiter.mxfp4 import N_ALIGN, mxfp4_linear, prepare_weight
from atomlite.model_ops.aiter.norm_act import add_rms_norm, gelu_tanh_and_mul, rms_norm

__all__ = ["OPS", "limits", "mxfp4_linear", "prepare_weight"]

OPS = {
    "attention": paged_attention,
    "write_kv": write_kv,
    "rms_norm": rms_norm,
    "add_rms_norm": add_rms_norm,
    "gelu_tanh_and_mul": gelu_tanh_and_mul,
    "mxfp4_linear": mxfp4_linear,
}

CK_MAX_HEAD_DIM = 256


def _shape_refusal(op: str, platform, shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    if op == "attention" and shape.get("k_from_v"):
        return "AITER's attention reads a K cache; keys derived from V run on Triton"
    if op == "attention" and head_dim is not None:
        if head_dim > CK_MAX_HEAD_DIM:
            return f"CK flash attention stops at head_dim {CK_MAX_HEAD_DIM} (got {head_dim})"
        if head_dim % 8:
            return f"CK flash attention needs head_dim divisible by 8 (got {head_dim})"
    if op == "mxfp4_linear":
        if platform.arch not in detect.FP4_ARCHS:
            return f"MXFP4 GEMM needs gfx950 ({platform.arch} has no FP4 compute; gemm_a4w4 raises there)"
        if not shape.get("dynamic_input", True):
            return "gemm_a4w4 quantizes activations too; weight-only MXFP4 is left to Triton"
        if shape.get("n", 0) % N_ALIGN:
            return f"gemm_a4w4's weight shuffle needs out_features divisible by {N_ALIGN} (got {shape['n']})"
    return None


def limits(op: str, platform, shape: dict) -> str | None:
    """None when AITER serves this op and shape on `platform`, else why not."""
    if platform.kind != "rocm" or not platform.has_aiter:
        return "AITER needs ROCm with the aiter package installed"
    if platform.arch not in detect.SUPPORTED_ARCHS:
        return f"AITER kernels target {'/'.join(detect.SUPPORTED_ARCHS)}, not {platform.arch}"
    refusal = _shape_refusal(op, platform, shape)
    if refusal:
        return refusal
    missing = detect.missing_functions(REQUIRED.get(op, ()), platform)
    if missing:
        reason = detect.load_error() if platform == detect.local_platform() else None
        return reason or f"this AITER has no {', '.join(missing)}"
    return None
