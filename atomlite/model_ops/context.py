"""What one forward step needs to know about the batch: set once by the model runner, read by attention layers."""
from dataclasses import dataclass, field

import torch


@dataclass
class HostBatch:
    """The batch's lengths as the host knows them, so that no layer reads them back from the device."""
    query_starts: list[int]  # [B + 1]
    seq_lens: list[int] | None  # [B] keys per sequence after this step; None where the host does not know them
    max_query_len: int
    max_seq_len: int  # at least every seq_len: exact, or a bound (graph replay: the block table's capacity)
    decode_only: bool  # every sequence adds exactly one query

    @classmethod
    def of(cls, query_starts: list[int], seq_lens: list[int]) -> "HostBatch":
        query_lens = [end - start for start, end in zip(query_starts, query_starts[1:])]
        return cls(query_starts, seq_lens, max(query_lens, default=0), max(seq_lens, default=0),
                   all(n == 1 for n in query_lens))


@dataclass
class GroupBatch:
    """One KV group's view of the batch: where each new token's K/V goes, and each sequence's blocks."""
    slot_mapping: torch.Tensor  # [T] int64; -1 = do not store
    block_table: torch.Tensor  # [B, max_blocks] int32
    # What a kernel backend derives from this step's batch for this group (e.g. AITER's prefill gather), built by
    # the group's first layer and reused by the others. None: the context is replayed across steps (decode graphs),
    # so nothing derived from one step's data may be kept.
    derived: dict | None = field(default_factory=dict)


@dataclass
class ForwardContext:
    positions: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, keys per sequence after this step
    groups: dict[int, GroupBatch]
    host: HostBatch | None = None  # None: the caller knows no lengths on the host
