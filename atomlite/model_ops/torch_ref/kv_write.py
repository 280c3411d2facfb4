import torch


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in the cache's dtype; fp8 saturates at its largest finite value, as the GPU's conversion does."""
    if dtype.itemsize == 1:
        limit = torch.finfo(dtype).max
        x = x.float().clamp(-limit, limit)
    return x.to(dtype)


def write_kv(k: torch.Tensor | None, v: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store k, v [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D] at flat slots; slots < 0 are skipped.
    Without a K cache (a layer that derives K from V) only v is stored."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = v_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    if k_cache is not None:
        k_cache[blocks, offsets] = to_cache_dtype(k[keep], k_cache.dtype)
    v_cache[blocks, offsets] = to_cache_dtype(v[keep], v_cache.dtype)
