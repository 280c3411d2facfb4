import torch

from atomlite.model_ops.carriers import NormedPair, PartialSums, summed as added_up
from atomlite.model_ops.kernels import declare


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: fp32 math, plain weight (not 1 + w); weight None means no scale."""
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def rms_norm_residual(x: torch.Tensor | PartialSums | NormedPair, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float, scale: torch.Tensor | None = None,
                      next_weight: torch.Tensor | tuple[torch.Tensor, ...] | None = None):
    """summed = (residual + rms_norm(x, weight)) [* scale], rounded to the dtype after each step; returns
    (summed, rms_norm(summed, next_weight) or None), or with a tuple of next weights a tuple of those norms (the
    branches that read summed, each with its own weight). x may be a split-K GEMM's PartialSums, or a NormedPair
    (computed with the same eps)."""
    if isinstance(x, NormedPair):
        x = rms_norm_pair_sum(x.a, x.b, x.weight_a, x.weight_b, eps)
    summed = (residual + rms_norm(added_up(x), weight, eps)).to(residual.dtype)
    if scale is not None:
        summed = (summed * scale).to(residual.dtype)
    if isinstance(next_weight, tuple):
        return summed, tuple(rms_norm(summed, w, eps) for w in next_weight)
    return summed, None if next_weight is None else rms_norm(summed, next_weight, eps)


def rms_norm_pair_sum(a: torch.Tensor | PartialSums, b: torch.Tensor | PartialSums, weight_a: torch.Tensor,
                      weight_b: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(a, weight_a) + rms_norm(b, weight_b), each norm and the sum rounded to b's dtype: a NormedPair's
    value."""
    b = added_up(b)
    return (rms_norm(added_up(a), weight_a, eps) + rms_norm(b, weight_b, eps)).to(b.dtype)


declare("rms_norm", "torch", rms_norm)
# Adds a projection's split-K slices and joins two branches as it reads them, as the Triton kernel does.
declare("rms_norm_residual", "torch", rms_norm_residual, capabilities={"reads_partial_sums", "reads_normed_pair"})
