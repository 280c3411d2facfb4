"""Gemma RMSNorm (fp32 math, plain weight, optional weight) and the fused residual-add + RMSNorm.

Rows are addressed as (outer, inner) with two strides, so q/k/v norms run on [T, H, D] views of a fused qkv
projection without a copy.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting, run_kernel

MAX_DIM = 65536


@triton.jit
def _rms_norm_kernel(x, residual, weight, out, summed, num_rows, inner, dim, eps,
                     stride_xo, stride_xi, stride_ro, stride_ri,
                     HAS_WEIGHT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (cols < dim)[None, :]
    outer, within = rows // inner, rows % inner
    xv = tl.load(x + (outer * stride_xo + within * stride_xi)[:, None] + cols[None, :], mask=mask, other=0.0)
    xf = xv.to(tl.float32)
    out_offsets = rows[:, None] * dim + cols[None, :]
    if HAS_RESIDUAL:
        rv = tl.load(residual + (outer * stride_ro + within * stride_ri)[:, None] + cols[None, :], mask=mask,
                     other=0.0)
        total = (xf + rv.to(tl.float32)).to(summed.dtype.element_ty)
        tl.store(summed + out_offsets, total, mask=mask)
        xf = total.to(tl.float32)
    y = xf * tl.math.rsqrt(tl.sum(xf * xf, 1) / dim + eps)[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(weight + cols, mask=cols < dim, other=0.0).to(tl.float32)[None, :]
    tl.store(out + out_offsets, y.to(out.dtype.element_ty), mask=mask)


def _as_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """x viewed as [outer, inner, D] with unit last stride: (tensor, inner, stride_outer, stride_inner)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        x = x[None]
    if x.dim() > 3:
        x = x.reshape(-1, x.shape[-2], x.shape[-1])
    if x.dim() == 2:
        return x, 1, x.stride(0), 0
    return x, x.shape[1], x.stride(0), x.stride(1)


def _launch(x, residual, weight, eps):
    dim = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    num_rows = x.numel() // dim if dim else 0
    if num_rows == 0:
        return out, summed
    xr, inner, sxo, sxi = _as_rows(x)
    rr, _, sro, sri = _as_rows(residual) if residual is not None else (xr, inner, sxo, sxi)
    block_d = triton.next_power_of_2(dim)
    block_rows = max(1, min(16, 2048 // block_d))
    if interpreting():
        block_rows = max(1, min(64, 16384 // block_d))
    run_kernel(_rms_norm_kernel, (triton.cdiv(num_rows, block_rows),),
        xr, rr, weight if weight is not None else xr, out, summed if summed is not None else out,
        num_rows, inner, dim, eps, sxo, sxi, sro, sri,
        HAS_WEIGHT=weight is not None, HAS_RESIDUAL=residual is not None, BLOCK_ROWS=block_rows,
        BLOCK_D=block_d, num_warps=min(16, max(1, block_rows * block_d // 512)))
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Same contract as torch_ref.rms_norm."""
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as torch_ref.add_rms_norm, in one pass: (rms_norm(x + residual), x + residual)."""
    return _launch(x, residual, weight, eps)
