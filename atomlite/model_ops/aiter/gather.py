"""Where the keys each sequence's queries can see sit in the paged cache, for flash_attn_varlen_func's packed K/V.

The plan depends only on the step's lengths, the KV group's block table, its block size and the layer's window, so
it is built once per step and group (on the host, from HostBatch: step_plan, the attention kernel's step metadata)
and every layer of the group gathers with it.
"""
from dataclasses import dataclass

import torch

from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch
from atomlite.model_ops.kv_spec import KVSpec


@dataclass
class GatherPlan:
    blocks: torch.Tensor  # [Tk] int64, the physical block of each gathered key
    offsets: torch.Tensor  # [Tk] int64, its slot in that block
    cu_seqlens_k: torch.Tensor  # [B + 1] int32
    max_seqlen_k: int
    window: int | None  # the window it was planned for

    def gather(self, cache: torch.Tensor) -> torch.Tensor:
        """[num_blocks, block_size, Hkv, D] -> the visible keys (or values), packed [Tk, Hkv, D]."""
        return cache[self.blocks, self.offsets]


def first_visible_keys(seq_lens: torch.Tensor, query_lens: torch.Tensor, window: int | None) -> torch.Tensor:
    """Per sequence, the first key any of its queries sees (a sequence without queries sees none)."""
    if window is None:
        first = torch.zeros_like(seq_lens)
    else:
        first = (seq_lens - query_lens - window + 1).clamp(min=0)
    return torch.where(query_lens == 0, seq_lens, first)


def plan_gather(host: HostBatch, seq_lens: torch.Tensor, block_table: torch.Tensor, block_size: int,
                window: int | None) -> GatherPlan:
    """Built on the host; seq_lens (the device copy) is read back only where the host does not know them."""
    lens = torch.tensor(host.seq_lens if host.seq_lens is not None else seq_lens.tolist(), dtype=torch.int64)
    starts = torch.tensor(host.query_starts, dtype=torch.int64)
    first = first_visible_keys(lens, starts[1:] - starts[:-1], window)
    counts = lens - first
    cu = torch.nn.functional.pad(counts.cumsum(0), (1, 0))
    seq = torch.repeat_interleave(torch.arange(len(lens)), counts)
    positions = torch.arange(int(cu[-1])) - cu[:-1].repeat_interleave(counts) + first.repeat_interleave(counts)
    index = torch.stack([seq, positions // block_size, positions % block_size]).to(block_table.device)
    blocks = block_table[index[0], index[1]].long()
    return GatherPlan(blocks, index[2], cu.to(device=block_table.device, dtype=torch.int32),
                      int(counts.max()) if len(lens) else 0, window)


def step_plan(ctx: ForwardContext, group: GroupBatch, spec: KVSpec, block_size: int) -> GatherPlan | None:
    """The step's plan for a KV group, for all its layers; None for a decode-only step, whose kernel reads the block
    table itself, or where the host does not know the lengths."""
    host = ctx.host
    if host is None or host.seq_lens is None or host.decode_only:
        return None
    return plan_gather(host, ctx.seq_lens, group.block_table, block_size, spec.window)
