"""A split-K GEMM's output before its K slices are added up, for a consumer that adds them as it reads them."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PartialSums:
    """y [M, N] as fp32 partial sums parts [S, M, N], one per K slice: y is their sum, added in slice order and
    rounded to dtype (as the GEMM's own summing kernel writes it). The norm kernels take it in place of y and add
    the slices themselves, which saves the summing launch."""
    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]


def summed(y: "torch.Tensor | PartialSums") -> torch.Tensor:
    """y as a tensor: a PartialSums added up in slice order, anything else as it is."""
    if not isinstance(y, PartialSums):
        return y
    total = y.parts[0].clone()
    for part in y.parts[1:]:
        total += part
    return total.to(y.dtype)
