"""LoRA adapters of several slots applied to one batch, each row through its own slot (punica's gathered GEMMs):
shrink x to each slice's rank, then expand back into the projection's output. A fused projection (q/k/v, gate/up)
has one rank block per slice: A [L, slices * R, K] holds the slices' A stacked, B [L, N, R] each output row's B
in its own slice. A slot's B carries its scaling (lora_alpha / r), and ranks below R are zero-padded, so every slot
computes at rank R."""
import torch

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.kernels import declare


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x [T, K], a [L, R', K], slots [T] int32 (-1: no adapter) -> fp32 [T, R']: x @ a[slot]^T, 0 where none (a
    kernel may return it as PartialSums of K slices, for lora_expand to add)."""
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    rows = x.float()
    for slot in range(a.shape[0]):
        mine = (slots == slot)[:, None]
        out += torch.where(mine, rows @ a[slot].float().T, 0.0)
    return out


def lora_expand(y: torch.Tensor, shrunk: "torch.Tensor | PartialSums", b: torch.Tensor, slots: torch.Tensor,
                slice_sizes: tuple[int, ...]) -> None:
    """y [T, N] += for each slice i of y's columns (slice_sizes, in order): shrunk[:, i*R:(i+1)*R] @ b[slot,
    slice's columns]^T, in fp32, rounded once to y's dtype; rows without a slot (-1) unchanged. b [L, N, R].
    shrunk may be a shrink's K slices not yet added (PartialSums)."""
    if isinstance(shrunk, PartialSums):
        shrunk = shrunk.parts.sum(0)
    rank, start = b.shape[2], 0
    for i, size in enumerate(slice_sizes):
        part = shrunk[:, i * rank:(i + 1) * rank]
        delta = torch.zeros(y.shape[0], size, dtype=torch.float32, device=y.device)
        for slot in range(b.shape[0]):
            mine = (slots == slot)[:, None]
            delta += torch.where(mine, part @ b[slot, start:start + size].float().T, 0.0)
        y[:, start:start + size] = (y[:, start:start + size].float() + delta).to(y.dtype)
        start += size


declare("lora_shrink", "torch", lora_shrink)
declare("lora_expand", "torch", lora_expand)
