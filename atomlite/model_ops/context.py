"""What one forward step needs to know about the batch: set once by the model runner, read by attention layers."""
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from atomlite.model_ops.kv_spec import KVSpec


@dataclass
class HostBatch:
    """The batch's lengths as the host knows them, so that no layer reads them back from the device."""
    query_starts: list[int] | None  # [B + 1]; None where the host does not know them (prefill graphs)
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
    # What the group's attention kernel derives from this step's batch for all the group's layers (e.g. AITER's
    # prefill gather): its step_metadata's result, built once per step by whoever builds the context; kernels only
    # read it. None where the kernel needs nothing, and always in a context replayed across steps (decode graphs),
    # where nothing derived from one step's data may be kept.
    derived: object | None = None


# A kernel's per-step metadata function: (ctx, group, spec, block_size) -> what it derives from this step for that
# KV group (its KVSpec, cache block size), or None. An attention kernel that needs one carries it as its
# `step_metadata` attribute.
StepMetadata = Callable[["ForwardContext", GroupBatch, KVSpec, int], object | None]


@dataclass
class ForwardContext:
    positions: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, keys per sequence after this step
    groups: dict[int, GroupBatch]
    host: HostBatch | None = None  # None: the caller knows no lengths on the host
    # [T] int32: each new token's exclusive end of the keys it may see (block_key_ends), on layers built with
    # Attention(bidirectional_spans=True); other layers ignore it. None: plainly causal, the text-only path (decode
    # graphs never carry it). A query's key end is at least its position + 1 and at most its sequence's seq_len: an
    # image block must be in the cache by the end of the step that holds any of its queries (never split across
    # prefill chunks). Kernels find a query tile's largest key end on the device, so HostBatch carries no copy.
    key_ends: torch.Tensor | None = None


def block_key_ends(in_block: Sequence[bool]) -> list[int]:
    """Per position of one sequence, the exclusive end of the keys it may see when blocks attend both ways: the end
    of the maximal run of True it is in (an image's or a video's soft tokens; the tokens that open and close the
    image are text), else position + 1. A step's ForwardContext.key_ends holds its tokens' entries."""
    ends = [i + 1 for i in range(len(in_block))]
    for i in reversed(range(len(in_block) - 1)):
        if in_block[i] and in_block[i + 1]:
            ends[i] = ends[i + 1]
    return ends
