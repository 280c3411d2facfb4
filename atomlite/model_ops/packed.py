"""Several sequences of different lengths packed one after another along the token dim (an encoder's images), with
their boundaries both on the device (for kernels) and on the host (so that no layer reads them back)."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedSequences:
    """Sequence i holds rows cu_seqlens[i]:cu_seqlens[i + 1] of the packed tensors; `lengths` are the same lengths as
    the host knows them."""
    cu_seqlens: torch.Tensor  # [B + 1] int32, on the device of the packed rows
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, lengths: list[int], device: torch.device | str) -> "PackedSequences":
        starts = [0]
        for length in lengths:
            starts.append(starts[-1] + length)
        return cls(torch.tensor(starts, dtype=torch.int32, device=device), tuple(lengths))

    @property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def row_ranges(self) -> list[slice]:
        """Each sequence's rows of the packed tensors."""
        ranges, start = [], 0
        for length in self.lengths:
            ranges.append(slice(start, start + length))
            start += length
        return ranges
