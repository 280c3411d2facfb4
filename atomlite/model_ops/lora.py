"""A projection's LoRA slots: every adapter slot's A and B for one Linear, applied to each row through the slot that
row's sequence uses (the step's row slots, a static buffer the runner fills each step, so that decode graphs replay
with whatever adapters the batch holds).

A fused projection (q/k/v, gate/up) keeps one rank block per slice. Under tensor parallelism a column-parallel
projection keeps its rows of each slice's B (A whole); a row-parallel one its columns of A (B whole), so its
adapter's output is a partial sum that the projection's all-reduce completes with the base's."""
import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import PartialSums


class RowSlots:
    """Each row's adapter slot for the step running (-1: the base model): [max_rows] int32 on the device."""

    def __init__(self, max_rows: int, device: torch.device | str):
        self.slots = torch.full((max_rows,), -1, dtype=torch.int32, device=device)


class LoRASlots(nn.Module):
    """a [slots, slices * rank, in] and b [slots, out, rank] (its scaling folded in), zero until an adapter loads."""

    def __init__(self, in_features: int, slice_sizes: list[int], num_slots: int, rank: int, rows: RowSlots):
        super().__init__()
        self.slice_sizes, self.rank, self.rows = tuple(slice_sizes), rank, rows
        self.register_buffer("a", torch.zeros(num_slots, len(slice_sizes) * rank, in_features), persistent=False)
        self.register_buffer("b", torch.zeros(num_slots, sum(slice_sizes), rank), persistent=False)
        shape = dict(slices=len(slice_sizes), rank=rank)
        self._shrink = dispatch.choose("lora_shrink", **shape).fn
        self._expand = dispatch.choose("lora_expand", **shape).fn

    def shrink(self, x: torch.Tensor) -> "torch.Tensor | PartialSums":
        """Each row of x through its slot's A: the ranks that expand() takes."""
        return self._shrink(x, self.a, self.rows.slots[:x.shape[0]])

    def expand(self, y: "torch.Tensor | PartialSums", shrunk: "torch.Tensor | PartialSums") -> None:
        """y (the base projection's output; a PartialSums' first slice) += each row's shrunk ranks through its
        slot's B."""
        target = y.parts[0] if isinstance(y, PartialSums) else y
        self._expand(target, shrunk, self.b, self.rows.slots[:target.shape[0]], self.slice_sizes)

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def extra_repr(self) -> str:
        return f"slots={self.a.shape[0]}, rank={self.rank}, slices={self.slice_sizes}"
