"""RMSNorm and gelu_tanh_and_mul on AITER, with torch_ref's signatures (the residual update, add + norms, is
Triton's: docs/ROCM.md says why).

Weight convention: AITER's rmsnorm2d_fwd computes rmsnorm(x) * weight in fp32 with the weight as given
(its `gemma_norm=True` switches to (1 + weight), the Gemma 1-3 form). Gemma 4 stores the plain multiplier, so the
weight goes in unchanged and gemma_norm keeps its default False (present at HEAD only; the contract test checks
that default). A weightless norm passes a cached vector of ones.
"""
from functools import cache

import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.aiter import detect, functions as F
from atomlite.model_ops.kernels import declare

HALF_DTYPES = (torch.bfloat16, torch.float16)


@cache
def _ones(dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.ones(dim, dtype=dtype, device=device)


def _weight(weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return _ones(x.shape[-1], x.dtype, x.device) if weight is None else weight.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.dtype not in HALF_DTYPES:
        return torch_ref.rms_norm(x, weight, eps)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = detect.call(F.RMS_NORM, input=rows, weight=_weight(weight, x), epsilon=eps)
    return out.view(x.shape)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] on the last dim (AITER's order too) -> gelu_tanh(gate) * up."""
    if x.dtype not in HALF_DTYPES:
        return torch_ref.gelu_tanh_and_mul(x)
    out = x.new_empty(*x.shape[:-1], x.shape[-1] // 2)
    detect.call(F.GELU_TANH_AND_MUL, out=out, input=x.contiguous())
    return out


declare("rms_norm", "aiter", rms_norm, requires=(F.RMS_NORM,))
declare("gelu_tanh_and_mul", "aiter", gelu_tanh_and_mul, requires=(F.GELU_TANH_AND_MUL,))
