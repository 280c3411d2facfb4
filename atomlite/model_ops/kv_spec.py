"""What each attention layer asks of the KV cache, and the scales its values are stored with. Models declare these;
the engine reads them, and every kernel backend and the reference share the scale rule."""
import math
from dataclasses import dataclass

import torch

UNIT_SCALES = (1.0, 1.0)  # (K, V) scales of a cache that stores values as they are


def cache_scales(cache: torch.Tensor, kv_scales: tuple[float, float]) -> tuple[float, float]:
    """The (K, V) scales a cache's rows are read with: kv_scales for an fp8 cache, 1 for a 16-bit one."""
    return kv_scales if cache.element_size() == 1 else UNIT_SCALES


@dataclass(frozen=True)
class KVSpec:
    kind: str  # "full" | "sliding" | "shared"
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype: torch.dtype = torch.bfloat16
    window: int | None = None  # sliding: keys with q - k < window are visible
    target: int | None = None  # shared: the layer whose cache this layer reads
    k_from_v: bool = False  # the layer rebuilds K from V when it attends: the cache holds V only

    def __post_init__(self):
        if self.kind not in ("full", "sliding", "shared"):
            raise ValueError(f"KVSpec kind {self.kind!r} is not full, sliding or shared")
        if (self.kind == "sliding") != (self.window is not None):
            raise ValueError("a sliding KVSpec needs a window, and only a sliding one has one")
        if (self.kind == "shared") != (self.target is not None):
            raise ValueError("a shared KVSpec needs a target layer, and only a shared one has one")

    @property
    def group_key(self) -> tuple:
        return self.kind, self.num_kv_heads, self.head_dim, self.dtype, self.window, self.k_from_v

    @property
    def tensors_per_token(self) -> int:
        return 1 if self.k_from_v else 2

    @property
    def bytes_per_token(self) -> int:
        """K and V (V alone when K is derived from it) of one token in one layer."""
        return self.tensors_per_token * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def blocks_held(self, seq_len: int, block_size: int) -> int:
        """Most blocks one sequence of seq_len tokens holds in decode."""
        blocks = math.ceil(seq_len / block_size)
        if self.kind == "sliding":
            blocks = min(blocks, math.ceil(self.window / block_size) + 1)
        return blocks

    def describe(self) -> str:
        shape = f"{self.num_kv_heads} kv heads x {self.head_dim}, {str(self.dtype).removeprefix('torch.')}"
        if self.k_from_v:
            shape += ", V only (K derived)"
        return f"sliding(window={self.window}), {shape}" if self.kind == "sliding" else f"full, {shape}"
