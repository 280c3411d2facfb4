"""gelu_tanh(gate) * up for x = [gate | up], computed in fp32 and rounded once."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel
from atomlite.model_ops.kernels import declare

SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def gelu_tanh(gate):
    """gelu(gate, approximate="tanh") of fp32 values."""
    # 0.5 * (1 + tanh(z)) == sigmoid(2z): no tanh intrinsic needed; the clamp keeps exp finite (gelu ~ 0 there).
    z = SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
    return gate / (1.0 + tl.exp(tl.minimum(-2.0 * z, 80.0)))


@triton.jit
def _gelu_tanh_and_mul_kernel(x, out, inner, stride_xt, stride_ot, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(x + token * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + token * stride_xt + inner + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + token * stride_ot + cols, (gelu_tanh(gate) * up).to(out.dtype.element_ty), mask=mask)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same contract as torch_ref.gelu_tanh_and_mul: x [..., 2I] -> [..., I]."""
    inner = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inner), dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 or x.stride(-1) != 1 else x
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if rows.shape[0] == 0 or inner == 0:
        return out
    block = min(2048, triton.next_power_of_2(inner))
    grid = (rows.shape[0], triton.cdiv(inner, block))
    run_kernel(_gelu_tanh_and_mul_kernel, grid, rows, out, inner, rows.stride(0), inner, BLOCK=block,
                                    num_warps=4 if block <= 1024 else 8)
    return out


declare("gelu_tanh_and_mul", "triton", gelu_tanh_and_mul)
