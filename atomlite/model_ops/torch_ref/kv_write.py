import torch


def write_kv(k: torch.Tensor | None, v: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store k, v [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D] at flat slots; slots < 0 are skipped.
    Without a K cache (a layer that derives K from V) only v is stored."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = v_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    if k_cache is not None:
        k_cache[blocks, offsets] = k[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[keep].to(v_cache.dtype)
