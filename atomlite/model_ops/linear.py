import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.branches import OVERLAP_MAX_ROWS, side_by_side
from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.sharding import ReducesOutput


def check_shape(param: torch.Tensor, loaded: torch.Tensor, expected: tuple | None = None) -> None:
    expected = tuple(param.shape) if expected is None else expected
    if tuple(loaded.shape) != expected:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")


def copy_weight(param: torch.Tensor, loaded: torch.Tensor) -> None:
    check_shape(param, loaded)
    param.data.copy_(loaded)


class Linear(nn.Module):
    """y = x W^T (no bias). Quantized weights plug in as other linear classes with their own weight_loader.
    Linked to a consumer that adds split-K slices as it reads them (model_ops.fusion), it returns PartialSums."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = copy_weight
        self.kernel = dispatch.choose("linear", n=out_features, k=in_features)
        self.returns_partial_sums = False
        self.lora = None  # its LoRASlots (model_ops.lora) when the engine serves adapters

    def forward(self, x: torch.Tensor) -> "torch.Tensor | PartialSums":
        if self.lora is None:
            return self.kernel.fn(x, self.weight, summed=not self.returns_partial_sums)
        # The adapter's shrink reads x as the base GEMM does: beside it, on a stream of its own, a decode batch's
        # shrink (a few latency-bound microseconds) hides under the GEMM's weight stream instead of adding to it.
        shrunk, y = side_by_side(lambda: self.lora.shrink(x),
                                 lambda: self.kernel.fn(x, self.weight, summed=not self.returns_partial_sums),
                                 x.device, overlap=x.shape[0] <= OVERLAP_MAX_ROWS, lane="lora")
        self.lora.expand(y, shrunk)
        return y

    def can(self, capability: str) -> bool:
        return self.kernel.can(capability)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms


class MergedLinear(Linear):
    """Several projections of the same input stored as one weight (e.g. gate and up): one GEMM instead of two.

    The checkpoint keeps them apart; weight_loader(param, tensor, shard) copies shard i into its rows.
    """

    def __init__(self, in_features: int, out_features: list[int]):
        super().__init__(in_features, sum(out_features))
        self.shard_offsets = [sum(out_features[:i]) for i in range(len(out_features))]
        self.shard_sizes = list(out_features)
        self.weight.weight_loader = self._load_shard
        self.weight.num_shards = len(out_features)

    def _load_shard(self, param: torch.Tensor, loaded: torch.Tensor, shard: int) -> None:
        start, size = self.shard_offsets[shard], self.shard_sizes[shard]
        check_shape(param, loaded, (size, self.in_features))
        param.data[start:start + size].copy_(loaded)


class RowParallelLinear(ReducesOutput, Linear):
    """A Linear holding a slice of the input dim (in_features is the slice's): its output is all-reduced."""
