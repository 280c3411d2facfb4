"""vLLM's per-layer KV cache as atomlite's K and V caches, without copying (kept free of vLLM imports so the
kernels can be tested on this layout without vLLM installed)."""
import torch


def split_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks, num_kv_heads, block_size, 2 * head_size] (any stride order vLLM's KVCacheLayout picks; K in
    the first head_size channels) -> K, V views [num_blocks, block_size, num_kv_heads, head_size]."""
    k_cache, v_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return k_cache, v_cache
