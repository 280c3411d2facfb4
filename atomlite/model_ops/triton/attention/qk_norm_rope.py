"""Everything between the QKV projection and attention in one launch: q = rope(norm(q) * w_q), k = rope(norm(k) *
w_k), v = norm(v) (v as projected with v_norm=False), with k and v stored straight into the paged cache (or returned,
when the caller's attention owns the cache). A program takes one head row of one token (of several at prefill); each
row is rounded to the activation dtype after the norm, as the separate norm and RoPE kernels would, so the result
equals theirs."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.kv_spec import UNIT_SCALES
from atomlite.model_ops.triton.attention.tuning import (INTERPRETER_TOKENS_PER_PROGRAM, MANY_TOKENS,
                                                        MANY_TOKENS_WARP_FACTOR, QK_NORM_ROPE_WARPS,
                                                        QK_NORM_ROPE_WARPS_WIDE_HEAD, QK_NORM_ROPE_WIDE_HEAD_DIM,
                                                        TOKENS_PER_PROGRAM)
from atomlite.model_ops.triton.common import (cache_max, dependent_launches, gdc_launch_dependents, gdc_wait,
                                              interpreting, pdl_launch, run_kernel)
from atomlite.model_ops.triton.norm.residual import load_row
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.attention import tuning


@triton.jit(do_not_specialize=["num_tokens"])
def _prepare_kernel(q, k, v, q_out, k_dst, v_dst, q_weight, k_weight, cos, sin, slot_mapping, eps, num_tokens,
                    num_q_heads, num_kv_heads, head_dim, k_inv_scale, v_inv_scale,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                    stride_d0, stride_d1, stride_dh, stride_ct, stride_st, stride_split,
                    SPLITS: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                    TO_CACHE: tl.constexpr, BLOCK_SIZE: tl.constexpr, HAS_Q_WEIGHT: tl.constexpr,
                    STORE_K: tl.constexpr, CACHE_MAX: tl.constexpr, PDL: tl.constexpr, NORM_V: tl.constexpr = True):
    """BLOCK_T tokens of one head row a program. PDL: a dependent launch; it lets the attention kernel after it
    start (and read the batch's bounds), and reads its slots and weights while the kernel ahead, which wrote q, k
    and v, finishes. SPLITS > 1: q, k and v are a split-K projection's fp32 slices, stride_split apart, added in
    slice order and rounded to the output dtype as the projection's own summing kernel would."""
    if PDL:
        gdc_launch_dependents()
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_ok = tokens < num_tokens
    row = tl.program_id(1)  # q heads, then k heads, then v heads
    cols = tl.arange(0, BLOCK_HALF)
    mask = token_ok[:, None] & (cols < HALF)[None, :]
    is_q = row < num_q_heads
    is_k = (row >= num_q_heads) & (row < num_q_heads + num_kv_heads)
    is_v = row >= num_q_heads + num_kv_heads
    head = tl.where(is_q, row, tl.where(is_k, row - num_q_heads, row - num_q_heads - num_kv_heads))
    # q rows go to q_out, k/v rows to kv_dst: two pointers, since an fp8 cache's element type is not q's
    q_dst = q_out + tokens[:, None] * stride_ot + head * stride_oh
    if is_q:
        src = q + tokens[:, None] * stride_qt + head * stride_qh
        kv_dst = k_dst + tl.zeros([BLOCK_T, 1], dtype=tl.int64)
        keep = token_ok
    else:
        if is_k:
            src = k + tokens[:, None] * stride_kt + head * stride_kh
        else:
            src = v + tokens[:, None] * stride_vt + head * stride_vh
        if TO_CACHE:
            slot = tl.load(slot_mapping + tokens, mask=token_ok, other=-1).to(tl.int64)
            keep = slot >= 0
            if not STORE_K:  # a layer that derives K from V stores V alone
                keep = keep & is_v
            slot = tl.maximum(slot, 0)
            offset = (slot // BLOCK_SIZE) * stride_d0 + (slot % BLOCK_SIZE) * stride_d1 + head * stride_dh
        else:
            keep = token_ok
            offset = tokens.to(tl.int64) * stride_d0 + head * stride_dh
        if is_k:
            kv_dst = k_dst + offset[:, None]
        else:
            kv_dst = v_dst + offset[:, None]
    if PDL:
        gdc_wait()
    x1 = load_row(src, cols[None, :], mask, stride_split, SPLITS, q_out.dtype.element_ty)
    x2 = load_row(src, HALF + cols[None, :], mask, stride_split, SPLITS, q_out.dtype.element_ty)
    if NORM_V:
        normed = True
    else:
        normed = ~is_v
    if normed:
        inv = tl.math.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / head_dim + eps)
        x1 = x1 * inv[:, None]
        x2 = x2 * inv[:, None]
    if HAS_Q_WEIGHT:
        weighted = ~is_v
    else:
        weighted = is_k
    if weighted:
        if is_q:
            w1 = tl.load(q_weight + cols, mask=cols < HALF, other=0.0).to(tl.float32)
            w2 = tl.load(q_weight + HALF + cols, mask=cols < HALF, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(k_weight + cols, mask=cols < HALF, other=0.0).to(tl.float32)
            w2 = tl.load(k_weight + HALF + cols, mask=cols < HALF, other=0.0).to(tl.float32)
        x1 = x1 * w1[None, :]
        x2 = x2 * w2[None, :]
    x1 = x1.to(q_out.dtype.element_ty).to(tl.float32)
    x2 = x2.to(q_out.dtype.element_ty).to(tl.float32)
    if ~is_v:  # V takes no RoPE
        cos_rows = cos + tokens[:, None] * stride_ct + cols[None, :]
        sin_rows = sin + tokens[:, None] * stride_st + cols[None, :]
        c1 = tl.load(cos_rows, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_rows + HALF, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_rows, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_rows + HALF, mask=mask, other=0.0).to(tl.float32)
        r1 = x1 * c1 - x2 * s1
        r2 = x2 * c2 + x1 * s2
        x1 = r1
        x2 = r2
    if is_q:
        tl.store(q_dst + cols[None, :], x1.to(q_out.dtype.element_ty), mask=mask)
        tl.store(q_dst + HALF + cols[None, :], x2.to(q_out.dtype.element_ty), mask=mask)
    else:
        if CACHE_MAX > 0:  # an fp8 cache holds K / k_scale and V / v_scale, and saturates
            inv_scale = tl.where(is_v, v_inv_scale, k_inv_scale)
            x1 = tl.clamp(x1 * inv_scale, -CACHE_MAX, CACHE_MAX)
            x2 = tl.clamp(x2 * inv_scale, -CACHE_MAX, CACHE_MAX)
        store = mask & keep[:, None]
        tl.store(kv_dst + cols[None, :], x1.to(kv_dst.dtype.element_ty), mask=store)
        tl.store(kv_dst + HALF + cols[None, :], x2.to(kv_dst.dtype.element_ty), mask=store)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 slot_mapping: torch.Tensor | None = None, kv_scales: tuple[float, float] = UNIT_SCALES,
                 v_norm: bool = True):
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
        block_t = TOKENS_PER_PROGRAM if num_tokens >= MANY_TOKENS else 1
        if interpreting():
            block_t = min(INTERPRETER_TOKENS_PER_PROGRAM, triton.next_power_of_2(num_tokens))
        warps = QK_NORM_ROPE_WARPS_WIDE_HEAD if head_dim >= QK_NORM_ROPE_WIDE_HEAD_DIM else QK_NORM_ROPE_WARPS
        run_kernel(_prepare_kernel, (triton.cdiv(num_tokens, block_t), num_q_heads + 2 * num_kv_heads),
                   q, k, v, q_out, k_dst, v_dst, q if q_weight is None else q_weight,
                   q if k_weight is None else k_weight, cos, sin,
                   slot_mapping if to_cache else q, eps, num_tokens, num_q_heads, num_kv_heads, head_dim,
                   1.0 / kv_scales[0], 1.0 / kv_scales[1],
                   q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                   q_out.stride(0), q_out.stride(1), *dst_strides, cos.stride(0), sin.stride(0), stride_split,
                   SPLITS=splits, HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_T=block_t,
                   TO_CACHE=to_cache,
                   BLOCK_SIZE=v_cache.shape[1] if to_cache else 1, HAS_Q_WEIGHT=q_weight is not None,
                   STORE_K=k_cache is not None, CACHE_MAX=cache_max(v_cache if to_cache else None),
                   PDL=pdl, **({} if v_norm else {"NORM_V": False}),  # the default keeps recorded launches' keys
                   num_warps=warps * (MANY_TOKENS_WARP_FACTOR if block_t > 1 else 1), **pdl_launch(pdl))
    return q_out, k_out, v_out


def _refuses(platform, shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    return f"head_dim {head_dim} is odd" if head_dim is not None and head_dim % 2 else None


declare("qk_norm_rope", "triton", qk_norm_rope, refuses=_refuses, tuning=tuning, capabilities={"reads_partial_sums"})
