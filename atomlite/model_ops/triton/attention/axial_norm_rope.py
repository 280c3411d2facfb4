"""A vision tower's attention inputs in one launch: each head of the q/k/v projections' output RMS-normed (q and k
with their learned weights, v without one) and q and k turned by 2-D axial RoPE (the first half of a head by the
patch's x, the second by its y, each half rotate-half), where the eager path launched a norm per projection and
the RoPE's cat, neg, mul and add per tensor.

A program takes TOKENS rows of one head of [T, (H + 2 KV) * D] and writes them to [T, H + 2 KV, D]; the head's
index says whether it is a q, k or v head. Math in fp32, one rounding on the store.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.attention.tuning import AXIAL_TOKENS_PER_PROGRAM, AXIAL_WARPS
from atomlite.model_ops.triton.common import run_kernel
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.attention import tuning


@triton.jit
def _axial_norm_rope_kernel(
        qkv, out, q_weight, k_weight, cos, sin, num_tokens, stride_t, stride_ot, eps,
        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
        TOKENS: tl.constexpr):
    HALF: tl.constexpr = HEAD_DIM // 2
    PAIR: tl.constexpr = HEAD_DIM // 4
    head = tl.program_id(1)
    is_q = head < NUM_HEADS
    is_k = (head >= NUM_HEADS) & (head < NUM_HEADS + NUM_KV_HEADS)
    tokens = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    dims = tl.arange(0, DIM_P)
    dim_ok = dims < HEAD_DIM
    mask = (tokens < num_tokens)[:, None] & dim_ok[None, :]
    rows = tokens.to(tl.int64)[:, None]
    src = qkv + rows * stride_t + head * HEAD_DIM
    x = tl.load(src + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)

    # the rotate-half partner of each dim within its half, and the weight both are scaled by
    within = dims % HALF
    partner = dims - within + (within + PAIR) % HALF
    weight = tl.where(is_q, tl.load(q_weight + dims, mask=dim_ok & is_q, other=0.0).to(tl.float32),
                      tl.load(k_weight + dims, mask=dim_ok & is_k, other=0.0).to(tl.float32))
    partner_weight = tl.where(is_q, tl.load(q_weight + partner, mask=dim_ok & is_q, other=0.0).to(tl.float32),
                              tl.load(k_weight + partner, mask=dim_ok & is_k, other=0.0).to(tl.float32))
    y = x * inv_rms[:, None]
    if is_q | is_k:
        turned = tl.load(src + partner[None, :], mask=mask, other=0.0).to(tl.float32) * inv_rms[:, None]
        angles = rows * HEAD_DIM + dims[None, :]  # cos/sin [T, 2, D / 2]: dim d's angle at d
        c = tl.load(cos + angles, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin + angles, mask=mask, other=0.0).to(tl.float32)
        sign = tl.where(within < PAIR, -1.0, 1.0)
        y = y * weight[None, :] * c + sign[None, :] * (turned * partner_weight[None, :]) * s
    tl.store(out + rows * stride_ot + head * HEAD_DIM + dims[None, :], y.to(out.dtype.element_ty), mask=mask)


def axial_qkv_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                        cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Same contract as torch_ref.axial_qkv_norm_rope."""
    head_dim = cos.shape[-1] * 2
    heads = num_heads + 2 * num_kv_heads
    num_tokens = qkv.shape[0]
    out = torch.empty((num_tokens, heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return out
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    grid = (triton.cdiv(num_tokens, AXIAL_TOKENS_PER_PROGRAM), heads)
    run_kernel(_axial_norm_rope_kernel, grid, qkv, out, q_weight, k_weight, cos, sin, num_tokens, qkv.stride(0),
               out.stride(0), eps, NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
               DIM_P=triton.next_power_of_2(head_dim), TOKENS=AXIAL_TOKENS_PER_PROGRAM, num_warps=AXIAL_WARPS)
    return out


MAX_HEAD_DIM = 256  # one program holds a row of a head, padded to a power of two


def _refuses(platform, shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    if head_dim is not None and (head_dim % 4 or head_dim > MAX_HEAD_DIM):
        return f"head_dim {head_dim} is not a multiple of 4 up to {MAX_HEAD_DIM}"
    return None


# a vision tower's q/k/v norms and 2-D RoPE in one launch
declare("axial_qkv_norm_rope", "triton", axial_qkv_norm_rope, refuses=_refuses, tuning=tuning)
