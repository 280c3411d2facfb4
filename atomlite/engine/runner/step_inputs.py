"""A step's inputs, built one way for every step: the token ids and positions of its new tokens, where each
sequence's queries start and how long it is after the step, and per KV group each new token's slot and each
sequence's blocks; then, once per KV group, what the group's attention kernel derives from them (its
step_metadata). An eager step moves them to the device as they are; a decode step replayed from a graph copies them
into its static buffers (decode_graphs)."""
import itertools
from dataclasses import dataclass

import numpy as np
import torch

from atomlite.engine.kv.block_pool import NULL_BLOCK
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.sequence import Sequence
from atomlite.engine.images.seq_images import images_in
from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch, StepMetadata


@dataclass
class StepInputs:
    """One step's batch on the host, T new tokens of B sequences."""
    ids: np.ndarray | None  # [T] int64; None for a step launched ahead, whose ids are on the device
    positions: np.ndarray  # [T] int64
    query_starts: list[int]  # [B + 1]
    seq_lens: list[int]  # [B] keys per sequence after the step
    slots: list[np.ndarray]  # per KV group: [T] int64
    tables: list[np.ndarray]  # per KV group: [B, most blocks of one sequence] int32, the null block past a row's own
    key_ends: np.ndarray | None = None  # [T] int32 (ForwardContext.key_ends): steps with image soft tokens, where
    #                                     the model's layers let an image's tokens see the whole image
    lora_slots: np.ndarray | None = None  # [T] int32: each row's LoRA slot (-1: base); None: no row has an adapter

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def step_metadata_by_group(attention_layers) -> dict[int, StepMetadata]:
    """Each KV group's per-step metadata function: the attention kernel's step_metadata of the layers bound to it
    (bind_cache), where it has one."""
    found: dict[int, set] = {}
    for attention in attention_layers:
        build = getattr(attention, "step_metadata", None)
        if build is not None:
            found.setdefault(attention.group_id, set()).add(build)
    for group, builds in found.items():
        if len(builds) > 1:
            names = ", ".join(sorted(f"{b.__module__}.{b.__qualname__}" for b in builds))
            raise ValueError(f"KV group {group}'s layers were given attention kernels that each need their own "
                             f"per-step metadata ({names}); one group shares one")
    return {group: builds.pop() for group, builds in found.items()}


def _lora_slots(batch: list[tuple[Sequence, int]], counts: list[int]) -> np.ndarray | None:
    slots = [seq.lora_slot for seq, _ in batch]
    if all(slot < 0 for slot in slots):
        return None
    return np.repeat(np.array(slots, dtype=np.int32), counts)


class StepInputBuilder:
    """Builds each step's inputs (build) and, for an eager step, its context on the device (context).
    image_spans_bidirectional: the model declares layers that read key_ends (an image's tokens see each other both
    ways); steps with soft tokens then carry them."""

    def __init__(self, kv: KVCacheManager, device: torch.device, metadata: dict[int, StepMetadata],
                 image_spans_bidirectional: bool = False):
        self.kv, self.device, self.metadata = kv, device, metadata
        self.image_spans_bidirectional = image_spans_bidirectional

    def build(self, batch: list[tuple[Sequence, int]], ids_known: bool = True) -> StepInputs:
        """ids_known=False: a decode step launched before the host has its input ids (each sequence's position is
        then its num_computed_tokens, its token there not yet appended)."""
        counts = [n for _, n in batch]
        firsts = [seq.num_computed_tokens for seq, _ in batch]
        starts = [0, *itertools.accumulate(counts)]
        positions = np.array(firsts, dtype=np.int64)
        seq_index = np.arange(len(batch))
        if starts[-1] != len(batch):  # more than one new token per sequence (decode steps take the short way)
            positions = np.arange(starts[-1], dtype=np.int64) + np.repeat(positions - starts[:-1], counts)
            seq_index = np.repeat(seq_index, counts)
        ids = None
        if ids_known:
            new_ids = (seq.input_ids(first, n) for (seq, n), first in zip(batch, firsts))
            ids = np.fromiter(itertools.chain.from_iterable(new_ids), dtype=np.int64, count=starts[-1])
        tables = [self._table(batch, group.id) for group in self.kv.groups]
        block_index, offset = np.divmod(positions, self.kv.block_size)
        slots = [table[seq_index, block_index] * np.int64(self.kv.block_size) + offset for table in tables]
        key_ends = self._key_ends(batch, positions, starts) if self.image_spans_bidirectional else None
        return StepInputs(ids, positions, starts, [f + n for f, n in zip(firsts, counts)], slots, tables, key_ends,
                          _lora_slots(batch, counts))

    @staticmethod
    def _key_ends(batch: list[tuple[Sequence, int]], positions: np.ndarray, starts: list[int]) -> np.ndarray | None:
        """Each row's exclusive key end: the soft tokens of an item that spans both ways (an image) see to its end,
        other rows causal; None when the step holds no such soft token (its attention is plainly causal)."""
        key_ends = None
        for (seq, num_new), row in zip(batch, starts):
            if not seq.images:
                continue
            first = seq.num_computed_tokens
            for image in images_in(seq.images, first, first + num_new):
                if not image.bidirectional:
                    continue
                if key_ends is None:
                    key_ends = (positions + 1).astype(np.int32)
                lo, hi = max(image.offset, first) - first, min(image.end, first + num_new) - first
                key_ends[row + lo:row + hi] = image.end
        return key_ends

    def build_draft(self, seqs: list[Sequence]) -> StepInputs:
        """A drafter's step: one query per sequence at its newest token's position p, which sees the target's keys
        0..p-1 (the kernels place a query at seq_len - 1) and writes no KV."""
        positions = np.array([len(seq.token_ids) - 1 for seq in seqs], dtype=np.int64)
        batch = [(seq, 1) for seq in seqs]
        tables = [self._table(batch, group.id) for group in self.kv.groups]
        ids = np.array([seq.token_ids[-1] for seq in seqs], dtype=np.int64)
        no_slots = np.full(len(seqs), -1, dtype=np.int64)
        return StepInputs(ids, positions, list(range(len(seqs) + 1)), positions.tolist(),
                          [no_slots] * len(tables), tables)

    @staticmethod
    def _table(batch: list[tuple[Sequence, int]], group_id: int) -> np.ndarray:
        rows = [seq.block_tables[group_id].array() for seq, _ in batch]
        table = np.full((len(rows), max(map(len, rows), default=0)), NULL_BLOCK, dtype=np.int32)
        for b, row in enumerate(rows):
            table[b, :len(row)] = row
        return table

    def context(self, inputs: StepInputs) -> tuple[torch.Tensor, ForwardContext]:
        """-> (input ids, context) on the device, for an eager forward."""
        groups = {group.id: GroupBatch(self._moved(slots), self._moved(table))
                  for group, slots, table in zip(self.kv.groups, inputs.slots, inputs.tables)}
        ctx = ForwardContext(self._moved(inputs.positions), self._i32(inputs.query_starts),
                             self._i32(inputs.seq_lens), groups, HostBatch.of(inputs.query_starts, inputs.seq_lens),
                             None if inputs.key_ends is None else self._moved(inputs.key_ends))
        self.attach_metadata(ctx)
        return self._moved(inputs.ids), ctx

    def attach_metadata(self, ctx: ForwardContext) -> None:
        """Each KV group's per-step metadata, built once for all its layers."""
        for group in self.kv.groups:
            build = self.metadata.get(group.id)
            if build is not None:
                batch = ctx.groups[group.id]
                batch.derived = build(ctx, batch, group.spec, self.kv.block_size)

    def _moved(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def _i32(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)
