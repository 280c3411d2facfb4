"""Decode steps replayed from CUDA/HIP graphs.

A decode-only step (every sequence adds one token it will sample from) runs the whole forward, every layer and
every KV group, from a graph captured once per batch-size bucket. The batch is padded to its bucket: padding rows
read token 0 at position 0, store no KV (slot -1) and see one key. Every input lives in a static buffer sized for
the largest bucket and for max_model_len; a step's inputs, built as an eager step's are (step_inputs), go into
pinned host mirrors, and each buffer is copied once. Without capture (CPU, tests) the same buffers feed an eager
forward, exactly as a replay reads them.
"""
import math

import numpy as np
import torch
from tqdm import tqdm

from atomlite.distributed.parallel import graph_steps
from atomlite.engine.kv.block_pool import NULL_BLOCK
from atomlite.engine.sequence import Sequence
from atomlite.engine.runner.step_inputs import StepInputBuilder, StepInputs
from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch
from atomlite.model_ops.dispatch import KernelChoices
from atomlite.model_ops.graph_capture import CaptureReport, bucket_sizes, capture_buckets

SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 8


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8, up to and including max_batch."""
    return bucket_sizes(max_batch, SMALL_BUCKETS, BUCKET_STEP)


def bucket_for(num_seqs: int, sizes: list[int]) -> int | None:
    return next((b for b in sizes if b >= num_seqs), None)


def is_decode_only(batch: list[tuple[Sequence, int]], queries_per_seq: int = 1) -> bool:
    """Every sequence adds exactly its last token and samples from it (queries_per_seq 1), or adds its last token
    and queries_per_seq - 1 drafts that it verifies."""
    return all(n == queries_per_seq and seq.num_computed_tokens + 1 == len(seq.token_ids)
               and len(seq.spec_token_ids) == queries_per_seq - 1 for seq, n in batch)


def graphs_off_reason(device: torch.device, enforce_eager: bool, kernels: KernelChoices) -> str | None:
    """Why decode steps cannot run from graphs, as the startup report says it; None when they can."""
    if device.type != "cuda":
        return "off (no GPU)"
    if enforce_eager:
        return "off (--enforce-eager)"
    unsafe = kernels.graph_unsafe()
    if unsafe:
        kernels_text = "; ".join(f"{key} ({why})" for key, why in unsafe.items())
        return f"off, decode runs eager: {kernels_text} cannot be captured"
    return None


def verify_graphs_off_reason(model) -> str | None:
    """Why verify steps (several queries per sequence) cannot replay from graphs where decode steps do: an attention
    kernel that needs the host's lengths for them (AITER's gathers keys per step); None when they can."""
    kernels = {attention.attend_kernel for attention in model.attention_layers()}
    unable = sorted({f"{k.backend} attention" for k in kernels if not k.can("graphs_multi_query")})
    return f"{', '.join(unable)} needs the host's lengths for them" if unable else None


def static_buffer(shape, dtype, device, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A device buffer and its host mirror (pinned where that makes the copy asynchronous)."""
    host = torch.zeros(shape, dtype=dtype, pin_memory=pin)
    return torch.zeros(shape, dtype=dtype, device=device), host


class StaticDecodeInputs:
    """Token ids, positions, sequence lengths, and per KV group the slot mapping and block table, for up to
    max_batch sequences of up to max_model_len tokens, each adding queries_per_seq tokens."""

    def __init__(self, builder: StepInputBuilder, max_batch: int, max_model_len: int, queries_per_seq: int = 1):
        kv, device = builder.kv, builder.device
        pin = device.type == "cuda"
        self.builder, self.queries = builder, queries_per_seq
        self.label = "Decode graphs" if queries_per_seq == 1 else f"Verify graphs ({queries_per_seq} tokens a sequence)"
        width = math.ceil(max_model_len / kv.block_size)
        self.capacity = width * kv.block_size  # keys a table row can address
        # ids, positions and each group's slots are rows of one small buffer: a whole copy each step costs less
        # than one copy per row; block tables are large (max_model_len wide), so only their used rows move.
        self.rows = static_buffer((2 + len(kv.groups), max_batch * queries_per_seq), torch.int64, device, pin)
        self.ids, self.positions = (tuple(t[i] for t in self.rows) for i in range(2))
        self.slots = [tuple(t[2 + g] for t in self.rows) for g in range(len(kv.groups))]
        self.seq_lens = static_buffer(max_batch, torch.int32, device, pin)
        self.tables = [static_buffer((max_batch, width), torch.int32, device, pin) for _ in kv.groups]
        # the same number of queries per sequence, so query starts never change
        self.query_start_loc = torch.arange(0, (max_batch + 1) * queries_per_seq, queries_per_seq,
                                            dtype=torch.int32, device=device)
        self.group_ids = [g.id for g in kv.groups]
        # numpy views of the host mirrors, made once: the step's inputs go into them
        self.host_rows = [t[1].numpy() for t in (self.ids, self.positions, self.seq_lens)]
        self.host_groups = [(slots[1].numpy(), table[1].numpy()) for slots, table in zip(self.slots, self.tables)]
        self._contexts: dict[int, ForwardContext] = {}
        # a step launched ahead fills the host mirrors while the step before may not have copied them yet
        self._copied = torch.cuda.Event() if pin else None

    def context(self, bucket: int) -> ForwardContext:
        """Views of the first `bucket` rows; the same tensors every step, as a graph needs. What the host knows is
        what holds for every step of the bucket: one query per row and the tables' capacity."""
        if bucket not in self._contexts:
            q, tokens = self.queries, bucket * self.queries
            groups = {gid: GroupBatch(slots[0][:tokens], table[0][:bucket])
                      for gid, slots, table in zip(self.group_ids, self.slots, self.tables)}
            host = HostBatch(list(range(0, tokens + 1, q)), None, max_query_len=q, max_seq_len=self.capacity,
                             decode_only=q == 1)
            ctx = ForwardContext(self.positions[0][:tokens], self.query_start_loc[:bucket + 1],
                                 self.seq_lens[0][:bucket], groups, host)
            self.builder.attach_metadata(ctx)
            check_nothing_kept(ctx)
            self._contexts[bucket] = ctx
        return self._contexts[bucket]

    def fill(self, inputs: StepInputs, bucket: int) -> None:
        """The step's rows, then padding rows up to bucket; one host-to-device copy per buffer."""
        n, q = inputs.num_seqs, self.queries
        if self._copied is not None:
            self._copied.synchronize()
        ids, positions, seq_lens = self.host_rows
        if inputs.ids is not None:
            ids[:n * q] = inputs.ids
        positions[:n * q], seq_lens[:n] = inputs.positions, inputs.seq_lens
        # padding sequences: their queries see keys 0.. of the null block (never written, so finite)
        ids[n * q:bucket * q], positions[n * q:bucket * q], seq_lens[n:bucket] = 0, 0, q
        for (slots, table), built_slots, built_table in zip(self.host_groups, inputs.slots, inputs.tables):
            _fill_group(slots, table, built_slots, built_table, n * q, bucket * q, bucket)
        for device, host in (self.rows, self.seq_lens):
            device.copy_(host, non_blocking=True)
        for device, host in self.tables:
            device[:bucket].copy_(host[:bucket], non_blocking=True)
        if self._copied is not None:
            self._copied.record()


def _fill_group(slots: np.ndarray, table: np.ndarray, built_slots: np.ndarray, built_table: np.ndarray,
                tokens: int, padded_tokens: int, bucket: int) -> None:
    n, width = built_table.shape
    slots[:tokens], slots[tokens:padded_tokens] = built_slots, -1
    table[:n, :width] = built_table
    # Padding rows read key 0 of their row's first block: whatever block id is left there is a valid one.
    table[n:bucket, 0] = NULL_BLOCK


def check_nothing_kept(ctx: ForwardContext) -> None:
    """A graph replays one context for every step of its bucket: no per-step metadata may be kept in it."""
    kept = [gid for gid, group in ctx.groups.items() if group.derived is not None]
    if kept:
        raise RuntimeError(f"the attention kernel of KV group(s) {kept} derives per-step metadata for a step "
                           f"whose lengths the host does not know, which a graph replay would reuse from the step it "
                           f"was built in: its step_metadata must return None there")


class DecodeGraphs:
    """Runs decode-only steps of up to max_batch sequences from per-bucket graphs (or, with capture=False, eagerly
    from the same static buffers). With queries_per_seq q > 1, the steps of sequences verifying q - 1 drafts each
    (every row's logits are kept)."""

    def __init__(self, model, builder: StepInputBuilder, max_batch: int, max_model_len: int, capture: bool = True,
                 keep_hidden: bool = False, queries_per_seq: int = 1):
        self.model, self.device, self.capture = model, builder.device, capture
        self.keep_hidden = keep_hidden  # a drafter reads the final hidden states too
        self.hidden: torch.Tensor | None = None  # [max_batch * q, hidden], written by every replay when kept
        self.builder, self.queries = builder, queries_per_seq
        self.label = "Decode graphs" if queries_per_seq == 1 else f"Verify graphs ({queries_per_seq} tokens a sequence)"
        self.sizes = graph_batch_sizes(max_batch)
        self.inputs = StaticDecodeInputs(builder, max_batch, max_model_len, queries_per_seq)
        self.logits: torch.Tensor | None = None  # [max_batch * q, vocab] fp32, written by every replay
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.report: CaptureReport | None = None

    def supports(self, batch: list[tuple[Sequence, int]]) -> bool:
        return self.fits(len(batch)) and is_decode_only(batch, self.queries)

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def _forward(self, bucket: int) -> torch.Tensor:
        ctx, rows = self.inputs.context(bucket), bucket * self.queries
        hidden = self.model(self.inputs.ids[0][:rows], ctx)
        logits = self.model.compute_logits(hidden).float()
        if self.logits is None:
            self.logits = logits.new_empty((self.sizes[-1] * self.queries, logits.shape[-1]))
        self.logits[:rows].copy_(logits)
        if self.keep_hidden:
            if self.hidden is None:
                self.hidden = hidden.new_empty((self.sizes[-1] * self.queries, hidden.shape[-1]))
            self.hidden[:rows].copy_(hidden)
        return self.logits[:rows]

    def capture_all(self) -> CaptureReport:
        """One graph per bucket, largest first, all in one memory pool (graph_capture)."""
        captured = capture_buckets(
            self.device, self.sizes, self._forward, lambda bucket: self.inputs.fill(self.builder.build([]), bucket),
            steps=graph_steps, progress=lambda sizes: tqdm(sizes, desc=self.label, unit="graph", delay=1.0))
        self.graphs.update(captured.graphs)
        self.report = captured.report("decode graphs", "batch sizes")
        return self.report

    def run(self, inputs: StepInputs, ids: torch.Tensor | None = None) -> torch.Tensor:
        """-> fp32 logits [num_seqs * queries_per_seq, vocab] of a decode-only step's inputs (StepInputBuilder.build).
        ids: the input token ids on the device, one per sequence, for a step launched before the host has them
        (inputs built with ids_known=False)."""
        num_seqs = inputs.num_seqs
        bucket, rows = bucket_for(num_seqs, self.sizes), num_seqs * self.queries
        self.inputs.fill(inputs, bucket)
        if ids is not None:
            self.inputs.ids[0][:num_seqs].copy_(ids)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.logits[:rows]
        return self._forward(bucket)[:rows]
