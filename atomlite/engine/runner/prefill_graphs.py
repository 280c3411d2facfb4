"""Prefill and mixed steps replayed from CUDA/HIP graphs, one per bucket of new tokens.

A step that is not decode-only (a prompt, a chunk of one, prompts beside decoding sequences) and carries no image or
audio soft tokens runs the model's forward, attention included, from a graph captured once per token bucket: launched
eagerly, the ~500 kernels of a 512-token prefill of 26B-A4B kept an H200 idle two thirds of the time (TTFT 63.5 ms
against 21.5 ms replayed), and under tensor parallelism every rank waited for the slowest host. The attention
kernels read each sequence's lengths from the device and size their grid by the bucket's tokens plus one tile per
sequence slot, so one graph serves any split of its tokens over up to max_seqs sequences. Rows past the step's
tokens belong to padding sequences of at most max_model_len tokens each (so that no key position passes the RoPE
tables): token 0 at position 0, no KV stored (slot -1), keys read from the null block; sequence slots past them hold
no query.
Layers that rebuild keys from V build them once for the prefilling sequences whose keys fit q's size, planned on the
device (the host's lengths, which an eager prefill plans with, are not part of a graph); the attention derives the
others' inside its kernel. The graph leaves the final hidden rows in its pool; the logits of
the rows that need them follow eagerly, as after an eager forward. Without capture (CPU, tests) the same static
buffers feed an eager forward, exactly as a replay reads them.
"""
import math

import numpy as np
import torch
from tqdm import tqdm

from atomlite.distributed.parallel import graph_steps
from atomlite.engine.kv.block_pool import NULL_BLOCK
from atomlite.engine.runner.decode_graphs import bucket_for, check_nothing_kept, static_buffer
from atomlite.engine.runner.step_inputs import StepInputBuilder, StepInputs
from atomlite.engine.sequence import Sequence
from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch
from atomlite.model_ops.graph_capture import CaptureReport, bucket_sizes, capture_buckets

SMALL_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512)
TOKEN_BUCKET_STEP = 256


def prefill_token_buckets(max_tokens: int) -> list[int]:
    """16, 32, .., 512, then steps of 256, up to and including max_tokens."""
    return bucket_sizes(max_tokens, SMALL_TOKEN_BUCKETS, TOKEN_BUCKET_STEP)


class StaticPrefillInputs:
    """Token ids, positions and per KV group each token's slot for up to max_tokens new tokens; query starts,
    sequence lengths and per KV group the block tables of max_seqs sequences and the padding ones."""

    def __init__(self, builder: StepInputBuilder, max_tokens: int, max_seqs: int, max_model_len: int):
        kv, device = builder.kv, builder.device
        pin = device.type == "cuda"
        self.builder, self.max_tokens, self.max_model_len = builder, max_tokens, max_model_len
        # the step's sequences, then the padding sequences, then empty slots
        self.slots_count = max_seqs + math.ceil(max_tokens / max_model_len)
        width = math.ceil(max_model_len / kv.block_size)
        self.capacity = width * kv.block_size
        # ids, positions and each group's slots are rows of one buffer, query starts and lengths of another: two
        # copies a step; block tables move only their used rows
        self.rows = static_buffer((2 + len(kv.groups), max_tokens), torch.int64, device, pin)
        self.lengths = static_buffer(2 * self.slots_count + 1, torch.int32, device, pin)
        self.tables = [static_buffer((self.slots_count, width), torch.int32, device, pin) for _ in kv.groups]
        self.ids = self.rows[0][0]
        self.group_ids = [g.id for g in kv.groups]
        self.host_rows, self.host_lengths = self.rows[1].numpy(), self.lengths[1].numpy()
        self.host_tables = [table[1].numpy() for table in self.tables]
        self._contexts: dict[int, ForwardContext] = {}
        self._copied = torch.cuda.Event() if pin else None

    def context(self, bucket: int) -> ForwardContext:
        """Views of the first `bucket` token rows and of every sequence slot; the host knows only bounds."""
        if bucket not in self._contexts:
            rows, lengths, n = self.rows[0], self.lengths[0], self.slots_count
            groups = {gid: GroupBatch(rows[2 + g][:bucket], table[0])
                      for g, (gid, table) in enumerate(zip(self.group_ids, self.tables))}
            host = HostBatch(None, None, max_query_len=bucket, max_seq_len=self.capacity, decode_only=False)
            ctx = ForwardContext(rows[1][:bucket], lengths[:n + 1], lengths[n + 1:], groups, host)
            self.builder.attach_metadata(ctx)
            check_nothing_kept(ctx)
            self._contexts[bucket] = ctx
        return self._contexts[bucket]

    def fill(self, inputs: StepInputs, bucket: int) -> None:
        """The step's rows and sequences, then the padding sequences' rows up to bucket; one copy per buffer."""
        tokens, n, slots = inputs.query_starts[-1], inputs.num_seqs, self.slots_count
        padding = bucket - tokens
        pad_ends = np.minimum(np.arange(1, math.ceil(padding / self.max_model_len) + 1) * self.max_model_len, padding)
        used = n + len(pad_ends)
        if self._copied is not None:
            self._copied.synchronize()
        rows, lengths = self.host_rows, self.host_lengths
        rows[0, :tokens], rows[1, :tokens] = inputs.ids, inputs.positions
        rows[0, tokens:bucket], rows[1, tokens:bucket] = 0, 0
        for g, built_slots in enumerate(inputs.slots):
            rows[2 + g, :tokens], rows[2 + g, tokens:bucket] = built_slots, -1
        lengths[:n + 1] = inputs.query_starts
        lengths[n + 1:used + 1] = tokens + pad_ends
        lengths[used + 1:slots + 1] = bucket  # later slots hold no query
        seq_lens = lengths[slots + 1:]
        seq_lens[:n], seq_lens[n:used], seq_lens[used:] = inputs.seq_lens, np.diff(pad_ends, prepend=0), 0
        for table, built in zip(self.host_tables, inputs.tables):
            table[:n, :built.shape[1]] = built
            table[n:used] = NULL_BLOCK
        self.rows[0][:, :bucket].copy_(self.rows[1][:, :bucket], non_blocking=True)
        self.lengths[0].copy_(self.lengths[1], non_blocking=True)
        for device, host in self.tables:
            device[:used].copy_(host[:used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()


class PrefillGraphs:
    """Runs steps of up to max_tokens new tokens of up to max_seqs sequences from per-bucket graphs (or, with
    capture=False, eagerly from the same static buffers); run returns the step's final hidden rows."""

    label = "Prefill graphs"

    def __init__(self, model, builder: StepInputBuilder, max_tokens: int, max_seqs: int, max_model_len: int,
                 capture: bool = True):
        self.model, self.device, self.capture = model, builder.device, capture
        self.builder, self.max_seqs = builder, max_seqs
        self.sizes = prefill_token_buckets(max_tokens)
        self.inputs = StaticPrefillInputs(builder, max_tokens, max_seqs, max_model_len)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # each graph's hidden rows, in its pool
        self.report: CaptureReport | None = None

    def supports(self, batch: list[tuple[Sequence, int]]) -> bool:
        return len(batch) <= self.max_seqs and sum(n for _, n in batch) <= self.sizes[-1]

    def _forward(self, bucket: int) -> torch.Tensor:
        hidden = self.model(self.inputs.ids[:bucket], self.inputs.context(bucket))
        self.outputs[bucket] = hidden
        return hidden

    def fill_padding_alone(self, bucket: int) -> None:
        """The static buffers as a capture finds them: a step of the bucket's padding sequences alone."""
        groups = len(self.inputs.group_ids)
        empty = StepInputs(np.zeros(0, np.int64), np.zeros(0, np.int64), [0], [], [np.zeros(0, np.int64)] * groups,
                           [np.zeros((0, 0), np.int32)] * groups)
        self.inputs.fill(empty, bucket)

    def capture_all(self) -> CaptureReport:
        """One graph per token bucket, largest first, all in one memory pool (graph_capture); each captured on a
        step of padding alone."""
        captured = capture_buckets(
            self.device, self.sizes, self._forward, self.fill_padding_alone,
            steps=graph_steps, progress=lambda sizes: tqdm(sizes, desc=self.label, unit="graph", delay=1.0))
        self.graphs.update(captured.graphs)
        self.report = captured.report("prefill graphs", "token counts")
        return self.report

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """-> the final hidden rows [T, hidden] of a step's inputs (StepInputBuilder.build)."""
        tokens = inputs.query_starts[-1]
        bucket = bucket_for(tokens, self.sizes)
        self.inputs.fill(inputs, bucket)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket][:tokens]
        return self._forward(bucket)[:tokens]
