"""AMD AITER kernels behind torch_ref's op signatures (ROCm gfx942 / gfx950 only; `import aiter` happens lazily, on
the first kernel call or availability check on such a machine, never on CPU or CUDA).

limits() answers from the shape, the platform's arch and which AITER functions exist (the real module on this
machine, the pinned signatures for a hand-made Platform), so dispatch falls to Triton/torch with the reason.
DECLINED names the ops AITER has a kernel family for that atomlite leaves to Triton, and why; dispatch reports it.

Why not AITER's fused MoE (aiter.fused_moe.fused_moe, read at ROCm/aiter e4048607): Gemma 4's experts compute
down(gelu_tanh(gate(x)) * up(x)), and fused_moe has no tanh GELU on any path. Its ActivationType (csrc/include/
aiter_enum.h) is No/Silu/Gelu/Swiglu/Situv2, and Gelu is erf GELU:
- bf16 experts (QuantType.No), gfx942 and gfx950: no 1-stage kernel takes Gelu with bf16 (fused_moe.py:1281-1307)
  and no tuned row has Gemma 4's shapes, so both stages run on CK (fused_moe.py:2874-2934), whose stage 1 maps Gelu
  to CK's act 0 (csrc/ck_gemm_moe_2stages_codegen/gemm_moe_ck2stages.cu:16-31): CK's gridwise MoE GEMM epilogue
  applies element_wise::Gelu, 0.5x(1 + erf(x/sqrt(2))). AITER's own reference is F.gelu, erf (ops/quant.py:680-686,
  fused_moe.py:3667-3678), as is aiter.gelu_and_mul (csrc/kernels/activation_kernels.cu:663-671).
- MXFP4 experts (QuantType.per_1x32, gfx950 only): with FlyDSL installed (a HEAD requirement) the default path is
  the FlyDSL kernel (fused_moe.py:2694-2797), whose wrapper turns every activation but Swiglu/Situv2 into "silu"
  (fused_moe.py:1433-1438), so Gelu runs as SiLU; without FlyDSL, CK or CK-Tile with erf GELU.
Layout and routing would fit (w1 gate rows first with gate_mode "separated"; routing weights after down with
doweight_stage1=False; shuffle_weight(w, (16, 16)) once at load, e8m0_shuffle for MXFP4 scales): the missing piece
is a tanh GELU activation in AITER. Running erf GELU instead would change every expert's output (by up to ~5e-4 per
unit of up(x)), which the torch reference, the oracle, would not match.
"""
import torch

from atomlite.model_ops.aiter import detect
from atomlite.model_ops.aiter.all_reduce import SUPPORTED_WORLD_SIZES, AiterAllReduce, unavailable
from atomlite.model_ops.aiter.attention import HALF_DTYPES, paged_attention, write_kv
from atomlite.model_ops.aiter.encoder import encoder_attention
from atomlite.model_ops.aiter.functions import REQUIRED
from atomlite.model_ops.aiter.mxfp4 import MXFP4_LINEAR, N_ALIGN, mxfp4_linear, prepare_weight
from atomlite.model_ops.aiter.norm_act import gelu_tanh_and_mul, rms_norm

__all__ = ["DECLINED", "OPS", "limits", "mxfp4_linear", "prepare_weight"]

OPS = {
    "attention": paged_attention,
    "encoder_attention": encoder_attention,  # flash_attn_varlen_func, not causal (CK's group-mode fmha forward)
    "write_kv": write_kv,
    "rms_norm": rms_norm,
    "gelu_tanh_and_mul": gelu_tanh_and_mul,
    "mxfp4_linear": MXFP4_LINEAR,
    "custom_all_reduce": AiterAllReduce,  # a tensor-parallel group's small all-reduces (a communicator factory)
}

CAPABILITIES = {}  # no kernel here takes or gives more than its op's plain tensors

_NO_TANH_GELU_MOE = ("AITER's fused_moe has no tanh GELU (its Gelu is erf GELU; its MXFP4 FlyDSL path runs SiLU "
                     "for it) and Gemma 4's experts use gelu_tanh")

# Ops with an AITER kernel family that atomlite does not route there, and why.
DECLINED = {
    "moe_experts": _NO_TANH_GELU_MOE,
    "mxfp4_moe_experts": _NO_TANH_GELU_MOE,
    "fp8_moe_experts": _NO_TANH_GELU_MOE,
    "fp8_linear": "AITER's gemm_a8w8 (per-token x per-channel) and gemm_a8w8_blockscale are not adapted yet (issue 55): "
                  "their contract is pinned on a ROCm machine first",
}

CK_MAX_HEAD_DIM = 256


def _shape_refusal(op: str, platform, shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    if op == "attention" and shape.get("k_from_v"):
        return "AITER's attention reads a K cache; keys derived from V run on Triton"
    if op == "encoder_attention" and shape.get("dtype", torch.bfloat16) not in HALF_DTYPES:
        return f"CK's flash attention forward takes bfloat16 or float16, not {shape['dtype']}"
    if op in ("attention", "encoder_attention") and head_dim is not None:
        if head_dim > CK_MAX_HEAD_DIM:
            return f"CK flash attention stops at head_dim {CK_MAX_HEAD_DIM} (got {head_dim})"
        if head_dim % 8:
            return f"CK flash attention needs head_dim divisible by 8 (got {head_dim})"
    if op == "custom_all_reduce" and shape.get("world") not in SUPPORTED_WORLD_SIZES:
        return (f"CustomAllreduce runs on {'/'.join(map(str, SUPPORTED_WORLD_SIZES))} ranks, not "
                f"{shape.get('world')}")
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
    if op in DECLINED:
        return DECLINED[op]
    refusal = _shape_refusal(op, platform, shape)
    if refusal:
        return refusal
    missing = detect.missing_functions(REQUIRED.get(op, ()), platform)
    if missing:
        reason = detect.load_error() if platform == detect.local_platform() else None
        return reason or f"this AITER has no {', '.join(missing)}"
    if op == "custom_all_reduce" and platform == detect.local_platform():
        return unavailable()
    return None
