"""The audio tower replayed from CUDA/HIP graphs: eager, a 30 s clip spent most of its time launching the conformer's
hundreds of small kernels from Python (issue 58: 93 ms TTFT against 41 ms for text of the same length on an H200).

Clips are encoded one per replay at a bucketed length: graphs are captured once per bucket (buckets of soft tokens,
times 4 log-mel frames), largest first in one memory pool, up to the most soft tokens a clip may have. A clip's
frames fill a static buffer, zeros after them up to the bucket, and its length in frames sits in a device buffer that
the tower's own masks read: the convolutions see the padding as their zero padding, the causal depthwise convolution
never reads ahead and attention masks keys past the clip, so the padding never reaches the clip's soft tokens. A
longer clip runs eager. Without capture (CPU, tests) the same buffers feed an eager pass.
"""

import torch

from atomlite.model_ops.graph_capture import CaptureReport, bucket_sizes, capture_buckets
from atomlite.models.gemma4_audio import soft_token_count
from atomlite.multimodal.audio import FRAMES_PER_SOFT_TOKEN, MEL_BINS

SMALL_BUCKETS = (50, 125, 250)  # soft tokens: 2 s, 5 s, 10 s
BUCKET_STEP = 125  # 5 s


def clip_buckets(max_soft_tokens: int) -> list[int]:
    """50, 125, 250, then steps of 125, up to and including max_soft_tokens."""
    return bucket_sizes(max_soft_tokens, SMALL_BUCKETS, BUCKET_STEP)


class ClipGraphs:
    def __init__(self, tower, max_soft_tokens: int):
        self.tower = tower
        self.device = tower.output_proj.bias.device
        self.sizes = clip_buckets(max_soft_tokens)
        self.features = torch.zeros(1, self.sizes[-1] * FRAMES_PER_SOFT_TOKEN, MEL_BINS, dtype=torch.float32,
                                    device=self.device)
        self.frames = torch.zeros(1, dtype=torch.int64, device=self.device)  # the clip's length, read by the masks
        self.out: torch.Tensor | None = None  # [largest bucket, text hidden]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.report: CaptureReport | None = None

    def bucket_for(self, frames: int) -> int | None:
        soft_tokens = soft_token_count(frames)
        return next((b for b in self.sizes if b >= soft_tokens), None)

    def _forward(self, bucket: int) -> torch.Tensor:
        soft_tokens = self.tower.encode_padded(self.features[:, :bucket * FRAMES_PER_SOFT_TOKEN], self.frames)[0]
        if self.out is None:
            self.out = soft_tokens.new_empty((self.sizes[-1], soft_tokens.shape[1]))
        self.out[:bucket].copy_(soft_tokens)
        return self.out

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """One clip's soft tokens (their own storage) from its bucket's graph; the clip must fit a bucket."""
        frames = len(features)
        bucket = self.bucket_for(frames)
        self.features[0, :frames].copy_(features)
        self.features[0, frames:bucket * FRAMES_PER_SOFT_TOKEN].zero_()
        self.frames.fill_(frames)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            out = self.out
        else:
            out = self._forward(bucket)
        return out[:soft_token_count(frames)].clone()

    def capture_all(self) -> CaptureReport:
        """One graph per bucket, largest first, all in one memory pool (graph_capture)."""
        self.features.zero_()
        captured = capture_buckets(self.device, self.sizes, self._forward,
                                   lambda bucket: self.frames.fill_(bucket * FRAMES_PER_SOFT_TOKEN))
        self.graphs.update(captured.graphs)
        self.report = captured.report("audio tower graphs", unit=" soft tokens")
        return self.report
