"""KV cache write: token t's K/V rows go to flat slot slot_mapping[t] of [num_blocks, block_size, Hkv, D] caches."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.kv_spec import UNIT_SCALES
from atomlite.model_ops.triton.attention.tuning import KV_WRITE_SMALL_ROW, KV_WRITE_WARPS, KV_WRITE_WARPS_LARGE_ROW
from atomlite.model_ops.triton.common import cache_max, run_kernel
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.attention import tuning


@triton.jit
def _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping, num_kv_heads, head_dim, k_inv_scale, v_inv_scale,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                     BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STORE_K: tl.constexpr,
                     CACHE_MAX: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping + token).to(tl.int64)
    if slot < 0:
        return
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    # Plain copies: no arithmetic, so the interpreter's bf16 bug cannot touch them.
    if STORE_K:
        k_row = tl.load(k + token * stride_kt + heads * stride_kh + dims, mask=mask)
        if CACHE_MAX > 0:  # an fp8 cache holds k / k_scale and saturates
            k_row = tl.clamp(k_row.to(tl.float32) * k_inv_scale, -CACHE_MAX, CACHE_MAX)
        k_dst = k_cache + block * stride_kcb + offset * stride_kcs + heads * stride_kch + dims
        tl.store(k_dst, k_row.to(k_cache.dtype.element_ty), mask=mask)
    v_row = tl.load(v + token * stride_vt + heads * stride_vh + dims, mask=mask)
    if CACHE_MAX > 0:
        v_row = tl.clamp(v_row.to(tl.float32) * v_inv_scale, -CACHE_MAX, CACHE_MAX)
    v_dst = v_cache + block * stride_vcb + offset * stride_vcs + heads * stride_vch + dims
    tl.store(v_dst, v_row.to(v_cache.dtype.element_ty), mask=mask)


def write_kv(k: torch.Tensor | None, v: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: tuple[float, float] = UNIT_SCALES) -> None:
    """Same contract as torch_ref.write_kv: k, v [T, Hkv, D]; slots < 0 are skipped; no K cache: v alone."""
    num_tokens, num_kv_heads, head_dim = v.shape
    if num_tokens == 0:
        return
    store_k = k_cache is not None
    if not store_k:
        k, k_cache = v, v_cache  # never read or written
    if k.stride(2) != 1:
        k = k.contiguous()
    if v.stride(2) != 1:
        v = v.contiguous()
    block_h, block_d = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    run_kernel(_write_kv_kernel, (num_tokens,),
        k, v, k_cache, v_cache, slot_mapping, num_kv_heads, head_dim, 1.0 / kv_scales[0], 1.0 / kv_scales[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), BLOCK_SIZE=v_cache.shape[1], BLOCK_H=block_h, BLOCK_D=block_d, STORE_K=store_k,
        CACHE_MAX=cache_max(v_cache),
        num_warps=KV_WRITE_WARPS if block_h * block_d <= KV_WRITE_SMALL_ROW else KV_WRITE_WARPS_LARGE_ROW)


declare("write_kv", "triton", write_kv, tuning=tuning)
