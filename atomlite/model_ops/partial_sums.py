"""Inputs a kernel finishes as it reads them (the norm kernels, the q/k/v prepare): a split-K GEMM's output before
its K slices are added up, and two branches' output norms before they are joined."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PartialSums:
    """y [M, N] as partial sums parts [S, M, N] (fp32, or rounded to dtype), one per K slice or routed expert: y
    is their sum, added in fp32 in slice order and rounded to dtype (as the GEMM's own summing kernel writes it).
    The norm kernels take it in place of y and add the slices themselves, which saves the summing launch."""
    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]


def split_columns(y: "torch.Tensor | PartialSums", sizes: list[int]) -> list:
    """y's last dimension in pieces of sizes (views; a PartialSums gives PartialSums of its slices' columns)."""
    if not isinstance(y, PartialSums):
        return list(y.split(sizes, dim=-1))
    return [PartialSums(part, y.dtype) for part in y.parts.split(sizes, dim=-1)]


def as_heads(y: "torch.Tensor | PartialSums", head_dim: int) -> "torch.Tensor | PartialSums":
    """[T, H * head_dim] -> [T, H, head_dim] (a view)."""
    if not isinstance(y, PartialSums):
        return y.view(y.shape[0], -1, head_dim)
    return PartialSums(y.parts.view(*y.parts.shape[:2], -1, head_dim), y.dtype)


def summed(y: "torch.Tensor | PartialSums") -> torch.Tensor:
    """y as a tensor: a PartialSums added up in slice order, anything else as it is."""
    if not isinstance(y, PartialSums):
        return y
    total = y.parts[0].to(torch.float32, copy=True)
    for part in y.parts[1:]:
        total += part
    return total.to(y.dtype)


@dataclass(frozen=True)
class NormedPair:
    """rms_norm(a, weight_a) + rms_norm(b, weight_b), each norm and the sum rounded to the activation dtype: two
    branches of a layer joined, each through its own output norm (a and b may be PartialSums). The residual update
    that reads it computes it as it reads the row, which saves a launch."""
    a: "torch.Tensor | PartialSums"
    b: "torch.Tensor | PartialSums"
    weight_a: torch.Tensor
    weight_b: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.b.shape
