"""AMD AITER kernels behind torch_ref's op signatures (ROCm gfx942 / gfx950 only; `import aiter` happens lazily, on
the first kernel call or availability check on such a machine, never on CPU or CUDA).

Each adapter module declares its kernel (model_ops.kernels) with the shapes it refuses and the AITER functions it
requires; the backend below checks the platform's arch first and, once a kernel took the shape, that those functions
exist (the real module on this machine, the pinned signatures for a hand-made Platform), so dispatch falls to
Triton/torch with the reason. The ops AITER has a kernel family for that atomlite leaves to Triton are declined
here, with why; dispatch reports it.

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
from atomlite.model_ops.aiter import detect
from atomlite.model_ops.aiter.attention import paged_attention, write_kv
from atomlite.model_ops.aiter.encoder import encoder_attention
from atomlite.model_ops.aiter.fp8 import FP8_LINEAR as fp8_linear
from atomlite.model_ops.aiter.mxfp4 import mxfp4_linear, prepare_weight
from atomlite.model_ops.aiter.norm_act import gelu_tanh_and_mul, rms_norm
from atomlite.model_ops.kernels import Backend, Kernel, decline, declare_backend

__all__ = ["encoder_attention", "fp8_linear", "gelu_tanh_and_mul", "mxfp4_linear", "paged_attention", "prepare_weight",
           "rms_norm", "write_kv"]

NO_TANH_GELU_MOE = ("AITER's fused_moe has no tanh GELU (its Gelu is erf GELU; its MXFP4 FlyDSL path runs SiLU "
                    "for it) and Gemma 4's experts use gelu_tanh")
for _op in ("moe_experts", "mxfp4_moe_experts", "fp8_moe_experts"):
    decline(_op, "aiter", NO_TANH_GELU_MOE)


def _unavailable(platform) -> str | None:
    if platform.kind != "rocm" or not platform.has_aiter:
        return "AITER needs ROCm with the aiter package installed"
    if platform.arch not in detect.SUPPORTED_ARCHS:
        return f"AITER kernels target {'/'.join(detect.SUPPORTED_ARCHS)}, not {platform.arch}"
    return None


def _lacks(kernel: Kernel, platform) -> str | None:
    """The AITER functions the kernel requires that this AITER lacks; on this machine, whether the kernel's own probe
    (a library that must have loaded) passes."""
    local = platform == detect.local_platform()
    missing = detect.missing_functions(kernel.requires, platform)
    if missing:
        return (detect.load_error() if local else None) or f"this AITER has no {', '.join(missing)}"
    return kernel.probe() if local and kernel.probe is not None else None


declare_backend(Backend("aiter", unavailable=_unavailable, lacks=_lacks))
