"""Gemma RMSNorm (fp32 math, plain weight, optional weight).

Rows are addressed as (outer, inner) with two strides, so q/k/v norms run on [T, H, D] views of a fused qkv
projection without a copy.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting, run_kernel
from atomlite.model_ops.triton.norm.tuning import (INTERPRETER_MAX_ROWS, INTERPRETER_PROGRAM_VALUES, MAX_WARPS,
                                                   RMS_MAX_ROWS, RMS_PROGRAM_VALUES, RMS_VALUES_PER_WARP)
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.norm import tuning

MAX_DIM = 65536


@triton.jit
def _rms_norm_kernel(x, weight, out, num_rows, inner, dim, eps, stride_xo, stride_xi,
                     HAS_WEIGHT: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (cols < dim)[None, :]
    outer, within = rows // inner, rows % inner
    xv = tl.load(x + (outer * stride_xo + within * stride_xi)[:, None] + cols[None, :], mask=mask, other=0.0)
    xf = xv.to(tl.float32)
    out_offsets = rows[:, None] * dim + cols[None, :]
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


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Same contract as torch_ref.rms_norm."""
    dim = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_rows = x.numel() // dim if dim else 0
    if num_rows == 0:
        return out
    xr, inner, sxo, sxi = _as_rows(x)
    block_d = triton.next_power_of_2(dim)
    block_rows = max(1, min(RMS_MAX_ROWS, RMS_PROGRAM_VALUES // block_d))
    if interpreting():
        block_rows = max(1, min(INTERPRETER_MAX_ROWS, INTERPRETER_PROGRAM_VALUES // block_d))
    run_kernel(_rms_norm_kernel, (triton.cdiv(num_rows, block_rows),),
        xr, weight if weight is not None else xr, out, num_rows, inner, dim, eps, sxo, sxi,
        HAS_WEIGHT=weight is not None, BLOCK_ROWS=block_rows, BLOCK_D=block_d,
        num_warps=min(MAX_WARPS, max(1, block_rows * block_d // RMS_VALUES_PER_WARP)))
    return out


def refuses_dim(platform, shape: dict) -> str | None:
    return f"dim {shape['dim']} exceeds {MAX_DIM}" if shape.get("dim", 0) > MAX_DIM else None


declare("rms_norm", "triton", rms_norm, refuses=refuses_dim, tuning=tuning)
