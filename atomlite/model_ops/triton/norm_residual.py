"""The residual update around a sublayer in one pass: summed = (residual + rms_norm(x) * w) [* scale], and
optionally the next norm of it, rms_norm(summed) * w_next; and two branches' output norms summed in one pass
(rms_norm_pair_sum). Each step rounds to the activation dtype where the separate ops would, so the result equals
theirs. One program per row."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel


@triton.jit
def _norm_residual_kernel(x, residual, weight, scale, next_weight, summed, out, dim, eps,
                          stride_x, stride_r, HAS_SCALE: tl.constexpr, HAS_NEXT: tl.constexpr,
                          BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < dim
    dtype = summed.dtype.element_ty
    xf = tl.load(x + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = xf * tl.math.rsqrt(tl.sum(xf * xf, 0) / dim + eps)
    y = (y * tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    total = (tl.load(residual + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32) + y).to(dtype)
    if HAS_SCALE:
        total = (total.to(tl.float32) * tl.load(scale).to(tl.float32)).to(dtype)
    tl.store(summed + row * dim + cols, total, mask=mask)
    if HAS_NEXT:
        tf = total.to(tl.float32)
        o = tf * tl.math.rsqrt(tl.sum(tf * tf, 0) / dim + eps)
        o = o * tl.load(next_weight + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + row * dim + cols, o.to(dtype), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, dim] with unit stride along dim (the kernels take one row stride)."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      scale: torch.Tensor | None = None, next_weight: torch.Tensor | None = None):
    """Same contract as torch_ref.rms_norm_residual."""
    dim = x.shape[-1]
    rows_x, rows_r = _rows(x), _rows(residual)
    summed = torch.empty(residual.shape, dtype=residual.dtype, device=x.device)
    out = torch.empty(residual.shape, dtype=residual.dtype, device=x.device) if next_weight is not None else None
    if rows_x.shape[0]:
        block_d = triton.next_power_of_2(dim)
        run_kernel(_norm_residual_kernel, (rows_x.shape[0],), rows_x, rows_r, weight,
                   scale if scale is not None else weight, next_weight if next_weight is not None else weight,
                   summed, out if out is not None else summed, dim, eps, rows_x.stride(0), rows_r.stride(0),
                   HAS_SCALE=scale is not None, HAS_NEXT=next_weight is not None, BLOCK_D=block_d,
                   num_warps=min(16, max(1, block_d // 512)))
    return summed, out


@triton.jit
def _norm_pair_sum_kernel(a, b, weight_a, weight_b, out, dim, eps, stride_a, stride_b, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < dim
    dtype = out.dtype.element_ty
    af = tl.load(a + row * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    bf = tl.load(b + row * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    ya = af * tl.math.rsqrt(tl.sum(af * af, 0) / dim + eps)
    yb = bf * tl.math.rsqrt(tl.sum(bf * bf, 0) / dim + eps)
    ya = (ya * tl.load(weight_a + cols, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    yb = (yb * tl.load(weight_b + cols, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(out + row * dim + cols, (ya + yb).to(dtype), mask=mask)


def rms_norm_pair_sum(a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """Same contract as torch_ref.rms_norm_pair_sum."""
    dim = a.shape[-1]
    rows_a, rows_b = _rows(a), _rows(b)
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    if rows_a.shape[0]:
        block_d = triton.next_power_of_2(dim)
        run_kernel(_norm_pair_sum_kernel, (rows_a.shape[0],), rows_a, rows_b, weight_a, weight_b, out, dim, eps,
                   rows_a.stride(0), rows_b.stride(0), BLOCK_D=block_d, num_warps=min(16, max(1, block_d // 512)))
    return out
