"""The vision tower replayed from CUDA/HIP graphs: eager, one 896x896 image spent most of its time launching kernels
from Python (bench/vision_profile.py: 40 ms of wall time for 18 ms of GPU work on the 31B tower).

A step's images are encoded at a bucketed patch count: graphs are captured once per bucket (buckets of soft tokens,
times pooling^2 patches), largest first in one memory pool, up to the most soft tokens the engine encodes in one step.
The step's real patches fill static buffers; the padding rows after them are one packed sequence of their own (they
never touch a real patch in attention), sit at position (0, 0) with zero pixels, and pool into one soft token past the
bucket's, which nobody reads. The sequence bounds are a buffer of MAX_IMAGES + 2 entries (the images, the padding,
then empty sequences), so the attention grid depends on the bucket alone. A step with more images, or more patches
than the largest bucket, runs eager. Without capture (CPU, tests) the same buffers feed an eager pass.
"""
from collections.abc import Sequence

import torch

from atomlite.model_ops.graph_capture import CaptureReport, bucket_sizes, capture_buckets
from atomlite.model_ops.packed import PackedSequences

SMALL_BUCKETS = (64, 128)  # soft tokens
BUCKET_STEP = 256
MAX_IMAGES = 16  # images per graph replay; sequences beyond a step's images are empty ones


def soft_token_buckets(max_soft_tokens: int) -> list[int]:
    """64, 128, then steps of 256, up to and including max_soft_tokens."""
    return bucket_sizes(max_soft_tokens, SMALL_BUCKETS, BUCKET_STEP)


class TowerGraphs:
    def __init__(self, tower, max_soft_tokens: int, capture: bool = True):
        self.tower, self.capture, self.pool = tower, capture, tower.pool ** 2
        table = tower.patch_embedder.position_embedding_table
        self.device = table.device
        self.sizes = soft_token_buckets(max_soft_tokens)
        rows = self.sizes[-1] * self.pool
        width = tower.patch_embedder.input_proj.weight.shape[1]
        self.pixels = torch.zeros(rows, width, dtype=torch.float32, device=self.device)
        # positions, then the soft token each row pools into: one host-to-device copy
        self.rows = torch.zeros(3, rows, dtype=torch.int64, device=self.device)
        self.cu_seqlens = torch.zeros(MAX_IMAGES + 2, dtype=torch.int32, device=self.device)
        self.out: torch.Tensor | None = None  # [largest bucket + 1, text hidden]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.report: CaptureReport | None = None

    def bucket_for(self, layout) -> int | None:
        soft_tokens = sum(layout.soft_tokens)
        if len(layout.soft_tokens) > MAX_IMAGES:
            return None
        return next((b for b in self.sizes if b >= soft_tokens), None)

    def _forward(self, bucket: int, lengths: tuple[int, ...]) -> torch.Tensor:
        rows = bucket * self.pool
        positions = self.rows[:2, :rows].t()
        packed = PackedSequences(self.cu_seqlens, lengths)
        soft_tokens = self.tower.encode_rows(self.pixels[:rows], positions, packed, self.rows[2, :rows], bucket + 1)
        if self.out is None:
            self.out = soft_tokens.new_empty((self.sizes[-1] + 1, soft_tokens.shape[1]))
        self.out[:bucket + 1].copy_(soft_tokens)
        return self.out

    def _fill(self, pixel_values: Sequence[torch.Tensor], layout, bucket: int) -> tuple[int, ...]:
        """The step's real patches, then padding up to the bucket; returns the host's lengths (images, padding,
        empty sequences)."""
        rows, real = bucket * self.pool, len(layout.positions)
        host = torch.zeros(3, rows, dtype=torch.int64)
        host[:2, :real] = layout.positions.t()
        host[2, :real] = layout.soft_token_rows
        host[2, real:] = bucket  # the soft token past the bucket's: never read
        self.rows[:, :rows].copy_(host)
        start = 0
        for values, image_rows in zip(pixel_values, layout.real_rows):
            count = len(image_rows)
            self.pixels[start:start + count].copy_(values.index_select(0, image_rows.to(values.device)))
            start += count
        self.pixels[real:rows].zero_()
        lengths = tuple(layout.lengths) + (rows - real,) + (0,) * (MAX_IMAGES - len(layout.lengths))
        bounds = torch.tensor(lengths).cumsum(0)
        self.cu_seqlens.copy_(torch.cat([torch.zeros(1, dtype=bounds.dtype), bounds]).to(torch.int32))
        return lengths

    def encode(self, pixel_values: Sequence[torch.Tensor], layout) -> list[torch.Tensor] | None:
        """Each image's soft tokens (their own storage), from the bucket's graph; None when no bucket fits."""
        bucket = self.bucket_for(layout)
        if bucket is None:
            return None
        lengths = self._fill(pixel_values, layout, bucket)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            out = self.out
        else:
            out = self._forward(bucket, lengths)
        return list(out[:sum(layout.soft_tokens)].clone().split(layout.soft_tokens))

    def capture_all(self) -> CaptureReport:
        """One graph per bucket, largest first, all in one memory pool (graph_capture). The host's lengths a graph
        keeps are its bucket's whole (AITER's longest sequence); the Triton kernel reads only the device's bounds."""
        def prepare(bucket: int) -> None:
            rows = bucket * self.pool
            self.rows.zero_()
            self.pixels.zero_()
            self.cu_seqlens.copy_(torch.tensor((0,) + (rows,) * (MAX_IMAGES + 1), dtype=torch.int32))

        captured = capture_buckets(self.device, self.sizes,
                                   lambda bucket: self._forward(bucket, (bucket * self.pool,) + (0,) * MAX_IMAGES),
                                   prepare)
        self.graphs.update(captured.graphs)
        self.report = captured.report("vision tower graphs", unit=" soft tokens")
        return self.report
