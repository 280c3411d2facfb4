import torch


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store k, v [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D] at flat slots; slots < 0 are skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[keep].to(v_cache.dtype)
