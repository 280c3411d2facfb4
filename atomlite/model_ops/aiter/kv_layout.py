"""KV-cache layouts AITER's kernels read, as pure torch transforms of atomlite's NHD cache.

atomlite's cache (and AITER's `reshape_and_cache_flash` / `paged_attention_v1(kv_cache_layout="NHD")` /
`flash_attn_varlen_func`) is NHD: [num_blocks, block_size, Hkv, D].

`pa_fwd_asm` (and `reshape_and_cache(asm_layout=True)`, which writes for it) reads, with x = 16 // element size:
  K [num_blocks, Hkv, D/x, block_size, x]     K5[b, h, d // x, s, d % x] = K[b, s, h, d]
  V [num_blocks, Hkv, block_size/x, D, x]     V5[b, h, s // x, d, s % x] = V[b, s, h, d]
(read from AITER csrc/kernels/cache_kernels.cu reshape_and_cache_kernel, tgt_key_idx / tgt_value_idx).
A cache is converted once, when it is allocated (asm_cache_shapes); the forward path never converts a whole cache.
"""
import torch

ASM_BLOCK_SIZE = 16
ASM_HEAD_DIM = 128
ASM_MAX_GQA = 16


def asm_x(dtype: torch.dtype) -> int:
    return 16 // torch.empty((), dtype=dtype).element_size()


def asm_cache_shapes(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                     dtype: torch.dtype) -> tuple[tuple[int, ...], tuple[int, ...]]:
    x = asm_x(dtype)
    if head_dim % x or block_size % x:
        raise ValueError(f"the ASM KV layout needs head_dim and block_size divisible by {x}")
    return ((num_blocks, num_kv_heads, head_dim // x, block_size, x),
            (num_blocks, num_kv_heads, block_size // x, head_dim, x))


def nhd_to_asm(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, bs, H, D] K and V -> pa_fwd_asm's 5-D K and V (new contiguous tensors)."""
    n, bs, h, d = k.shape
    x = asm_x(k.dtype)
    k5 = k.reshape(n, bs, h, d // x, x).permute(0, 2, 3, 1, 4)
    v5 = v.reshape(n, bs // x, x, h, d).permute(0, 3, 1, 4, 2)
    return k5.contiguous(), v5.contiguous()


def asm_to_nhd(k5: torch.Tensor, v5: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of nhd_to_asm, for any leading selection of blocks (the prefill gather uses it)."""
    n, h, d_groups, bs, x = k5.shape
    k = k5.permute(0, 3, 1, 2, 4).reshape(n, bs, h, d_groups * x)
    v = v5.permute(0, 2, 4, 1, 3).reshape(n, bs, h, d_groups * x)
    return k, v


def is_asm(k_cache: torch.Tensor) -> bool:
    return k_cache.dim() == 5


def block_size_of(k_cache: torch.Tensor) -> int:
    return k_cache.shape[3] if is_asm(k_cache) else k_cache.shape[1]


def asm_layout_fits(head_dim: int, gqa: int, window: bool, block_size: int, dtype: torch.dtype) -> bool:
    """Whether pa_fwd_asm can read this layer (head_dim 128, bf16/fp16 block 16, GQA <= 16, no window, fixed
    1/sqrt(128) scale folded into q); the engine would allocate asm_cache_shapes() for such a group."""
    return (head_dim == ASM_HEAD_DIM and gqa <= ASM_MAX_GQA and not window and block_size == ASM_BLOCK_SIZE
            and dtype in (torch.bfloat16, torch.float16))
