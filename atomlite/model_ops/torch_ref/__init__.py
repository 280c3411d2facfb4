"""Pure-torch implementations of every op: the CPU path and the reference every kernel is tested against."""
from atomlite.model_ops.torch_ref.activation import gelu_tanh_and_mul
from atomlite.model_ops.torch_ref.axial_norm_rope import axial_qkv_norm_rope
from atomlite.model_ops.torch_ref.attention import paged_attention
from atomlite.model_ops.torch_ref.encoder_attention import encoder_attention
from atomlite.model_ops.torch_ref.kv_write import write_kv
from atomlite.model_ops.torch_ref.fp8 import FP8_EXPERTS, FP8_LINEAR
from atomlite.model_ops.torch_ref.linear import linear
from atomlite.model_ops.torch_ref.moe import moe_experts, mxfp4_moe_experts
from atomlite.model_ops.torch_ref.mxfp4 import mxfp4_gemm
from atomlite.model_ops.torch_ref.mxfp4_family import MXFP4_EXPERTS, MXFP4_LINEAR
from atomlite.model_ops.torch_ref.norm import rms_norm, rms_norm_residual
from atomlite.model_ops.torch_ref.qk_norm_rope import qk_norm_rope
from atomlite.model_ops.torch_ref.rope import apply_rope
from atomlite.model_ops.torch_ref.router import router, router_topk

__all__ = ["apply_rope", "axial_qkv_norm_rope", "encoder_attention", "gelu_tanh_and_mul", "linear", "moe_experts", "mxfp4_gemm",
           "mxfp4_moe_experts", "paged_attention", "qk_norm_rope", "rms_norm", "rms_norm_residual",
           "router", "router_topk", "write_kv"]

OPS = {
    "attention": paged_attention,
    "encoder_attention": encoder_attention,
    "axial_qkv_norm_rope": axial_qkv_norm_rope,
    "write_kv": write_kv,
    "linear": linear,
    "rms_norm": rms_norm,
    "rms_norm_residual": rms_norm_residual,
    "qk_norm_rope": qk_norm_rope,
    "gelu_tanh_and_mul": gelu_tanh_and_mul,
    "moe_experts": moe_experts,
    "mxfp4_linear": MXFP4_LINEAR,
    "mxfp4_moe_experts": MXFP4_EXPERTS,
    "fp8_linear": FP8_LINEAR,
    "fp8_moe_experts": FP8_EXPERTS,
    "router_topk": router_topk,
    "router": router,
}

# The norms add a projection's split-K slices and join two branches as they read them, as the Triton kernels do.
CAPABILITIES = {
    "rms_norm_residual": {"reads_partial_sums", "reads_normed_pair"},
    "qk_norm_rope": {"reads_partial_sums"},
}

# What each op reads back to the host, or copies from it, on every call: a CUDA/HIP graph can capture neither.
LOOP_REASON = "experts run as a per-expert loop that syncs with the host"
MASKED_WRITE = "stores K/V at the slots a boolean mask selects, whose count the host reads back"
DECLINED = {
    "one_shot_all_reduce": "no reference kernel: the group's collective library (nccl, gloo) sums instead",
    "custom_all_reduce": "no reference: the group's collective library (nccl, gloo) sums instead",
}

GRAPH_UNSAFE = {
    "moe_experts": LOOP_REASON,
    "mxfp4_moe_experts": LOOP_REASON,
    "fp8_moe_experts": LOOP_REASON,
    "attention": "loops over the sequences, whose lengths it reads back to the host (.tolist())",
    "write_kv": MASKED_WRITE,
    "qk_norm_rope": MASKED_WRITE,
    "mxfp4_linear": "copies its FP4 value table from the host at every call",
}


def limits(op: str, platform, shape: dict) -> str | None:
    return None
