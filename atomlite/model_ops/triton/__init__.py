"""Triton kernels (ROCm and CUDA; CPU under TRITON_INTERPRET=1). Each op has the torch_ref op's signature."""
import torch

from atomlite.model_ops.triton.activation import gelu_tanh_and_mul
from atomlite.model_ops.peer_memory import PeerMemory
from atomlite.model_ops.triton.all_reduce import one_shot_all_reduce
from atomlite.model_ops.triton.attention.axial_norm_rope import axial_qkv_norm_rope
from atomlite.model_ops.triton.attention.encoder import encoder_attention
from atomlite.model_ops.triton.attention.paged import paged_attention
from atomlite.model_ops.triton.attention.tuning import ENCODER_MAX_HEAD_DIM
from atomlite.model_ops.triton.common import interpreting
from atomlite.model_ops.triton.attention.kv_write import write_kv
from atomlite.model_ops.triton.moe.gemm import moe_experts
from atomlite.model_ops.triton.fp8.family import FP8_EXPERTS, FP8_LINEAR
from atomlite.model_ops.triton.mxfp4.family import MXFP4_EXPERTS, MXFP4_LINEAR
from atomlite.model_ops.triton.norm.rms_norm import MAX_DIM, rms_norm
from atomlite.model_ops.triton.norm.residual import rms_norm_residual
from atomlite.model_ops.triton.attention.qk_norm_rope import qk_norm_rope
from atomlite.model_ops.triton.moe.router import router, router_topk
from atomlite.model_ops.triton.gemm.skinny import linear

__all__ = ["gelu_tanh_and_mul", "paged_attention", "rms_norm", "write_kv"]

OPS = {
    "attention": paged_attention,
    "encoder_attention": encoder_attention,  # a vision tower's packed images, bidirectional; one launch, no sync
    "axial_qkv_norm_rope": axial_qkv_norm_rope,  # a vision tower's q/k/v norms and 2-D RoPE in one launch
    "write_kv": write_kv,
    "linear": linear,  # the skinny split-K kernel for decode-sized batches, torch's GEMM beyond
    "rms_norm": rms_norm,
    "rms_norm_residual": rms_norm_residual,
    "qk_norm_rope": qk_norm_rope,
    "gelu_tanh_and_mul": gelu_tanh_and_mul,
    "moe_experts": moe_experts,  # routing, gate_up, down and the sum over a token's experts: capture-safe
    "mxfp4_linear": MXFP4_LINEAR,  # mxfp4_gemm, with the weights padded at load
    "mxfp4_moe_experts": MXFP4_EXPERTS,  # the moe_experts kernels on packed FP4 weights
    "fp8_linear": FP8_LINEAR,  # fp8 GEMM with the checkpoint's activation quantization fused in
    "fp8_moe_experts": FP8_EXPERTS,  # the same as a grouped GEMM over expert-sorted blocks: capture-safe
    "router_topk": router_topk,
    "router": router,  # the logits GEMM and router_topk in one launch at decode
    "one_shot_all_reduce": one_shot_all_reduce,  # tensor parallelism's decode all-reduce over peer memory
    "custom_all_reduce": PeerMemory.for_group,  # the group's peer memory, for one_shot_all_reduce and the
                                                # residual update that reads RankPartials
}

CAPABILITIES = {
    "linear": {"writes_partial_sums"},
    "rms_norm_residual": {"reads_partial_sums", "reads_normed_pair", "writes_quantized_rows", "reads_rank_partials"},
    "qk_norm_rope": {"reads_partial_sums"},
    "attention": {"writes_quantized_rows", "graphs_multi_query"},  # from its split-KV merge; the batch is found
                                                                  # on the device
    "encoder_attention": {"graphs_packed_sequences"},  # a grid by the pack's rows and bound count; bounds read on
                                                       # the device
    "moe_experts": {"writes_partial_sums"},  # each slot's term
    "mxfp4_linear": {"writes_partial_sums", "reads_quantized_rows", "reads_gated_input"},
    "mxfp4_moe_experts": {"writes_partial_sums"},
}

MAX_HEAD_DIM = 512
MAX_GQA_GROUP = 64
MIN_K_FROM_V_HEAD_DIM = 32  # the rotated columns of each half are read as tiles of at least 16
MAX_EXPERTS = 512  # the routing holds a one-hot [64, experts] per step
ENCODER_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
AXIAL_MAX_HEAD_DIM = 256  # one program holds a row of a head, padded to a power of two
MOE_DTYPES = {"moe_experts": (torch.bfloat16, torch.float16, torch.float32),
              "mxfp4_moe_experts": (torch.bfloat16, torch.float32)}  # FP4 expands to bf16 (fp32 for fp32)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def limits(op: str, platform, shape: dict) -> str | None:
    """None when the Triton kernel serves this op and shape, else why not (dispatch then falls back)."""
    if not platform.is_gpu and not interpreting():
        return "triton kernels need a GPU (or TRITON_INTERPRET=1)"
    head_dim = shape.get("head_dim")
    if op == "attention":
        if head_dim is not None and not (_is_power_of_two(head_dim) and 16 <= head_dim <= MAX_HEAD_DIM):
            return f"head_dim {head_dim} is not a power of two in [16, {MAX_HEAD_DIM}]"
        if shape.get("gqa", 1) > MAX_GQA_GROUP:
            return f"{shape['gqa']} query heads per KV head exceed {MAX_GQA_GROUP}"
        if shape.get("k_from_v") and head_dim is not None and head_dim < MIN_K_FROM_V_HEAD_DIM:
            return f"keys derived from V need head_dim >= {MIN_K_FROM_V_HEAD_DIM} (got {head_dim})"
    if op == "encoder_attention":
        return _encoder_refusal(shape)
    if op == "axial_qkv_norm_rope" and head_dim is not None and (head_dim % 4 or head_dim > AXIAL_MAX_HEAD_DIM):
        return f"head_dim {head_dim} is not a multiple of 4 up to {AXIAL_MAX_HEAD_DIM}"
    if op in ("one_shot_all_reduce", "custom_all_reduce") and platform.kind == "rocm":
        return ("not verified on ROCm, where IPC memory is coarse-grained (AITER's custom all-reduce is the way "
                "there)")
    if op == "linear" and platform.kind == "rocm":
        return "the skinny decode GEMM is measured against cuBLAS only, not yet against hipBLASLt"
    if op == "qk_norm_rope" and head_dim is not None and head_dim % 2:
        return f"head_dim {head_dim} is odd"
    if op in ("rms_norm", "rms_norm_residual") and shape.get("dim", 0) > MAX_DIM:
        return f"dim {shape['dim']} exceeds {MAX_DIM}"
    if op in MOE_DTYPES:
        return _moe_refusal(op, shape)
    if op in ("fp8_linear", "fp8_moe_experts"):
        if shape.get("experts", 0) > MAX_EXPERTS:
            return f"{shape['experts']} experts exceed {MAX_EXPERTS}"
        return _fp8_refusal(platform, shape)
    if op in ("router_topk", "router") and shape.get("experts", 0) > MAX_EXPERTS:
        return f"{shape['experts']} experts exceed the router kernel's {MAX_EXPERTS} (one program holds a row)"
    return None


def _moe_refusal(op: str, shape: dict) -> str | None:
    if shape.get("experts", 0) > MAX_EXPERTS:
        return f"{shape['experts']} experts exceed the fused MoE routing's {MAX_EXPERTS}"
    dtypes = MOE_DTYPES[op]
    if shape.get("dtype", torch.bfloat16) not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"{op} takes {names}, not {shape['dtype']}"
    return None


def _fp8_refusal(platform, shape: dict) -> str | None:
    if not platform.has_fp8:
        return f"{platform.arch} has no fp8 tensor cores"
    block_k, group = shape.get("block_k", 0), shape.get("group_size", 128)
    if shape.get("activation") == "group":
        if not _is_power_of_two(group) or group < 16:
            return f"activation group {group} is not a power of two >= 16 (one K step per group)"
        if block_k and block_k % group:
            return f"activation group {group} does not divide the weight's {block_k}-wide scale blocks"
    elif block_k and (block_k < 16 or not _is_power_of_two(block_k)):
        return f"weight scale blocks of {block_k} along K are not a power of two >= 16"
    return None


def _encoder_refusal(shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    if head_dim is not None and head_dim > ENCODER_MAX_HEAD_DIM:
        return f"head_dim {head_dim} exceeds the encoder kernel's {ENCODER_MAX_HEAD_DIM} (its tiles stop there)"
    if shape.get("gqa", 1) > MAX_GQA_GROUP:
        return f"{shape['gqa']} query heads per KV head exceed {MAX_GQA_GROUP}"
    if shape.get("dtype", torch.bfloat16) not in ENCODER_DTYPES:
        return f"encoder_attention takes bfloat16, float16 or float32, not {shape['dtype']}"
    return None
