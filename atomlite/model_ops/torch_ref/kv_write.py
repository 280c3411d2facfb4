import torch

from atomlite.model_ops.kv_spec import UNIT_SCALES
from atomlite.model_ops.kernels import declare


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x in the cache's dtype; an fp8 cache holds x / scale and saturates at its largest finite value, as the GPU's
    conversion does (a 16-bit cache holds x itself: scales are for fp8 caches only)."""
    if dtype.itemsize == 1:
        limit = torch.finfo(dtype).max
        x = (x.float() / scale).clamp(-limit, limit)
    return x.to(dtype)


def write_kv(k: torch.Tensor | None, v: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: tuple[float, float] = UNIT_SCALES) -> None:
    """Store k, v [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D] at flat slots; slots < 0 are skipped.
    Without a K cache (a layer that derives K from V) only v is stored. kv_scales: (K, V) scales of an fp8 cache,
    which stores k / k_scale and v / v_scale."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = v_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    if k_cache is not None:
        k_cache[blocks, offsets] = to_cache_dtype(k[keep], k_cache.dtype, kv_scales[0])
    v_cache[blocks, offsets] = to_cache_dtype(v[keep], v_cache.dtype, kv_scales[1])


MASKED_WRITE = "stores K/V at the slots a boolean mask selects, whose count the host reads back"
declare("write_kv", "torch", write_kv, graph_unsafe=MASKED_WRITE)
