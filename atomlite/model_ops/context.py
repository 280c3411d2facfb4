"""What one forward step needs to know about the batch: set once by the model runner, read by attention layers."""
from dataclasses import dataclass

import torch


@dataclass
class GroupBatch:
    """One KV group's view of the batch: where each new token's K/V goes, and each sequence's blocks."""
    slot_mapping: torch.Tensor  # [T] int64; -1 = do not store
    block_table: torch.Tensor  # [B, max_blocks] int32


@dataclass
class ForwardContext:
    positions: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, keys per sequence after this step
    groups: dict[int, GroupBatch]
