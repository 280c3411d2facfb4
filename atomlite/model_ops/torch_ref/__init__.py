"""Pure-torch implementations of every op: the CPU path and the reference every kernel is tested against. Each module
declares its kernel (model_ops.kernels)."""
from atomlite.model_ops.kernels import decline
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

decline("one_shot_all_reduce", "torch", "no reference kernel: the group's collective library (nccl, gloo) sums instead")
decline("custom_all_reduce", "torch", "no reference: the group's collective library (nccl, gloo) sums instead")
