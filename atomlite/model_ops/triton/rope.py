"""Rotate-half RoPE: dims (j, j + D/2) form a pair. The tables carry every dim, so proportional RoPE (frequencies
that do not rotate have cos 1, sin 0) needs nothing special."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel


@triton.jit
def _rope_kernel(x, cos, sin, out, num_heads, half,
                 stride_xt, stride_xh, stride_ct, stride_st, stride_ot, stride_oh,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (cols < half)
    row = x + token * stride_xt + heads * stride_xh + cols
    x1 = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + half, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos + token * stride_ct + cols, mask=cols < half, other=0.0).to(tl.float32)
    c2 = tl.load(cos + token * stride_ct + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    s1 = tl.load(sin + token * stride_st + cols, mask=cols < half, other=0.0).to(tl.float32)
    s2 = tl.load(sin + token * stride_st + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    dst = out + token * stride_ot + heads * stride_oh + cols
    tl.store(dst, (x1 * c1 - x2 * s1).to(out.dtype.element_ty), mask=mask)
    tl.store(dst + half, (x2 * c2 + x1 * s2).to(out.dtype.element_ty), mask=mask)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same contract as torch_ref.apply_rope: x [T, H, D]; cos/sin [T, D]."""
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    if x.stride(2) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    half = head_dim // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(num_heads), max(1, 4096 // block_half))
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    run_kernel(_rope_kernel, grid, x, cos, sin, out, num_heads, half, x.stride(0), x.stride(1), cos.stride(0),
                       sin.stride(0), out.stride(0), out.stride(1), BLOCK_H=block_h, BLOCK_HALF=block_half,
                       num_warps=4)
    return out
