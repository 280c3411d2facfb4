"""Triton kernels (ROCm and CUDA; CPU under TRITON_INTERPRET=1). Each op has the torch_ref op's signature; each
kernel module declares what it serves and refuses (model_ops.kernels)."""
from atomlite.model_ops.kernels import Backend, declare_backend
from atomlite.model_ops.triton.activation import gelu_tanh_and_mul
from atomlite.model_ops.triton.attention.paged import paged_attention
from atomlite.model_ops.triton.attention.kv_write import write_kv
from atomlite.model_ops.triton.attention.qk_norm_rope import qk_norm_rope
from atomlite.model_ops.triton.common import interpreting
from atomlite.model_ops.triton.moe.router import router, router_topk
from atomlite.model_ops.triton.norm.rms_norm import rms_norm
from atomlite.model_ops.triton.norm.residual import rms_norm_residual

__all__ = ["gelu_tanh_and_mul", "paged_attention", "qk_norm_rope", "rms_norm", "rms_norm_residual", "router",
           "router_topk", "write_kv"]


def _unavailable(platform) -> str | None:
    if not platform.is_gpu and not interpreting():
        return "triton kernels need a GPU (or TRITON_INTERPRET=1)"
    return None


declare_backend(Backend("triton", unavailable=_unavailable))
