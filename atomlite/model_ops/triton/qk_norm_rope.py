"""Everything between the QKV projection and attention in one launch: q = rope(norm(q) * w_q), k = rope(norm(k) *
w_k), v = norm(v), with k and v stored straight into the paged cache (or returned, when the caller's attention
owns the cache). One program per (token, head row); each row is rounded to the activation dtype after the norm,
as the separate norm and RoPE kernels would, so the result equals theirs."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.partial_sums import PartialSums
from atomlite.model_ops.torch_ref.kv_write import UNIT_SCALES
from atomlite.model_ops.triton.common import (cache_max, dependent_launches, gdc_launch_dependents, gdc_wait,
                                              pdl_launch, run_kernel)
from atomlite.model_ops.triton.norm_residual import load_row


@triton.jit
def _prepare_kernel(q, k, v, q_out, k_dst, v_dst, q_weight, k_weight, cos, sin, slot_mapping, eps,
                    num_q_heads, num_kv_heads, head_dim, k_inv_scale, v_inv_scale,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                    stride_d0, stride_d1, stride_dh, stride_ct, stride_st, stride_split,
                    SPLITS: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, TO_CACHE: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, HAS_Q_WEIGHT: tl.constexpr, STORE_K: tl.constexpr,
                    CACHE_MAX: tl.constexpr, PDL: tl.constexpr):
    """PDL: a dependent launch; it lets the attention kernel after it start (and read the batch's bounds), and
    reads its slot and weights while the kernel ahead, which wrote q, k and v, finishes. SPLITS > 1: q, k and v
    are a split-K projection's fp32 slices, stride_split apart, added in slice order and rounded to the output
    dtype as the projection's own summing kernel would."""
    if PDL:
        gdc_launch_dependents()
    token = tl.program_id(0)
    row = tl.program_id(1)  # q heads, then k heads, then v heads
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < HALF
    is_q = row < num_q_heads
    is_k = (row >= num_q_heads) & (row < num_q_heads + num_kv_heads)
    is_v = row >= num_q_heads + num_kv_heads
    head = tl.where(is_q, row, tl.where(is_k, row - num_q_heads, row - num_q_heads - num_kv_heads))
    # q rows go to q_out, k/v rows to kv_dst: two pointers, since an fp8 cache's element type is not q's
    q_dst = q_out + token * stride_ot + head * stride_oh
    if is_q:
        src = q + token * stride_qt + head * stride_qh
        kv_dst = k_dst
        keep = True
    else:
        if is_k:
            src = k + token * stride_kt + head * stride_kh
        else:
            src = v + token * stride_vt + head * stride_vh
        if TO_CACHE:
            slot = tl.load(slot_mapping + token).to(tl.int64)
            keep = slot >= 0
            if not STORE_K:  # a layer that derives K from V stores V alone
                keep = keep & is_v
            slot = tl.maximum(slot, 0)
            offset = (slot // BLOCK_SIZE) * stride_d0 + (slot % BLOCK_SIZE) * stride_d1 + head * stride_dh
        else:
            keep = True
            offset = token * stride_d0 + head * stride_dh
        if is_k:
            kv_dst = k_dst + offset
        else:
            kv_dst = v_dst + offset
    if PDL:
        gdc_wait()
    x1 = load_row(src, cols, mask, stride_split, SPLITS, q_out.dtype.element_ty)
    x2 = load_row(src, HALF + cols, mask, stride_split, SPLITS, q_out.dtype.element_ty)
    inv = tl.math.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / head_dim + eps)
    x1 = x1 * inv
    x2 = x2 * inv
    if HAS_Q_WEIGHT:
        weighted = ~is_v
    else:
        weighted = is_k
    if weighted:
        if is_q:
            w1 = tl.load(q_weight + cols, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(q_weight + HALF + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(k_weight + cols, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(k_weight + HALF + cols, mask=mask, other=0.0).to(tl.float32)
        x1 = x1 * w1
        x2 = x2 * w2
    x1 = x1.to(q_out.dtype.element_ty).to(tl.float32)
    x2 = x2.to(q_out.dtype.element_ty).to(tl.float32)
    if ~is_v:  # V takes no RoPE
        c1 = tl.load(cos + token * stride_ct + cols, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos + token * stride_ct + HALF + cols, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin + token * stride_st + cols, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin + token * stride_st + HALF + cols, mask=mask, other=0.0).to(tl.float32)
        r1 = x1 * c1 - x2 * s1
        r2 = x2 * c2 + x1 * s2
        x1 = r1
        x2 = r2
    if is_q:
        tl.store(q_dst + cols, x1.to(q_out.dtype.element_ty), mask=mask)
        tl.store(q_dst + HALF + cols, x2.to(q_out.dtype.element_ty), mask=mask)
    else:
        if CACHE_MAX > 0:  # an fp8 cache holds K / k_scale and V / v_scale, and saturates
            inv_scale = tl.where(is_v, v_inv_scale, k_inv_scale)
            x1 = tl.clamp(x1 * inv_scale, -CACHE_MAX, CACHE_MAX)
            x2 = tl.clamp(x2 * inv_scale, -CACHE_MAX, CACHE_MAX)
        store = mask & keep
        tl.store(kv_dst + cols, x1.to(kv_dst.dtype.element_ty), mask=store)
        tl.store(kv_dst + HALF + cols, x2.to(kv_dst.dtype.element_ty), mask=store)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 slot_mapping: torch.Tensor | None = None, kv_scales: tuple[float, float] = UNIT_SCALES):
    """Same contract as torch_ref.qk_norm_rope; q, k and v may be PartialSums slices of one split-K projection."""
    dtype, splits, stride_split = q.dtype, 1, 0
    if isinstance(q, PartialSums):
        splits, stride_split = q.parts.shape[0], q.parts.stride(0)
        if any(t is not None and t.parts.stride(0) != stride_split for t in (k, v)):
            raise ValueError("q, k and v must be slices of the same PartialSums")
        q, k, v = (None if t is None else t.parts[0] for t in (q, k, v))
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = 0 if k is None else k.shape[1]
    to_cache = k is not None and v_cache is not None
    q_out = torch.empty(q.shape, dtype=dtype, device=q.device)
    if k is None:
        k = v = k_dst = v_dst = q  # unused: no program reaches a K or V row
        k_out = v_out = None
    elif to_cache:
        k_dst = v_cache if k_cache is None else k_cache  # without a K cache no K row is stored
        v_dst, k_out, v_out = v_cache, None, None
    else:
        k_dst = k_out = torch.empty(k.shape, dtype=dtype, device=k.device)
        v_dst = v_out = torch.empty(v.shape, dtype=dtype, device=v.device)
    if num_tokens:
        cos, sin = cos.contiguous(), sin.contiguous()
        dst_strides = ((k_dst.stride(0), k_dst.stride(1), k_dst.stride(2)) if to_cache
                       else (k_dst.stride(0), 0, k_dst.stride(1)))
        half = head_dim // 2
        pdl = dependent_launches(q.device)
        run_kernel(_prepare_kernel, (num_tokens, num_q_heads + 2 * num_kv_heads),
                   q, k, v, q_out, k_dst, v_dst, q if q_weight is None else q_weight,
                   q if k_weight is None else k_weight, cos, sin,
                   slot_mapping if to_cache else q, eps, num_q_heads, num_kv_heads, head_dim,
                   1.0 / kv_scales[0], 1.0 / kv_scales[1],
                   q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                   q_out.stride(0), q_out.stride(1), *dst_strides, cos.stride(0), sin.stride(0), stride_split,
                   SPLITS=splits, HALF=half, BLOCK_HALF=triton.next_power_of_2(half), TO_CACHE=to_cache,
                   BLOCK_SIZE=v_cache.shape[1] if to_cache else 1, HAS_Q_WEIGHT=q_weight is not None,
                   STORE_K=k_cache is not None, CACHE_MAX=cache_max(v_cache if to_cache else None),
                   PDL=pdl, num_warps=4 if head_dim >= 512 else 2, **pdl_launch(pdl))
    return q_out, k_out, v_out
