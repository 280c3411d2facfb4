"""Paged attention for prefill and decode alike: one kernel over the batch's block tables.

Each program owns BLOCK_Q query positions of one sequence times the GROUP query heads that share one KV head,
stacked into BLOCK_M rows, so every K/V tile loaded is used by the whole GQA group. Programs find their sequence
by binary search over query_start_loc (no host sync, so the launch can be graph-captured). Query i of a sequence
with Lq queries and Lk keys sits at position Lk - Lq + i. With a window, tiles wholly before the window are
skipped and rows of blocks before it are never loaded (their block-table entries may point to a null block).
With SPLIT_KV the key range is cut into splits whose partial results split_kv.combine merges.
With HAS_KEY_ENDS (ForwardContext.key_ends: image blocks that attend both ways) a query sees the keys before its own
key end rather than those up to its position, and a tile walks up to the largest key end of its queries; the window
still counts back from each query's position.
"""
import dataclasses

import torch
import triton
import triton.language as tl

from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch
from atomlite.model_ops.k_from_v import KFromV
from atomlite.model_ops.kv_spec import UNIT_SCALES, KVSpec, cache_scales
from atomlite.model_ops.triton.attention import split_kv
from atomlite.model_ops.triton.attention.built_keys import (BuiltKeys, _key_rows, _rotated_key_columns, build_keys,
                                                            build_step_keys, key_row_starts, rotated_width)
from atomlite.model_ops.triton.attention.tuning import (DECODE_BLOCK_M, DECODE_BLOCK_N, DECODE_BLOCK_N_WIDE_VALUES,
                                                        DECODE_MAX_BLOCK_M, DECODE_MAX_QUERY_LEN,
                                                        DECODE_MIN_TILES_PER_SPLIT, DECODE_QUERIES_PER_SEQ,
                                                        DECODE_SHARED_WIDE_HEAD, DECODE_WIDE_HEAD_MAX_SPLITS,
                                                        DECODE_WARPS, DECODE_WARPS_ALONE, DECODE_WARPS_WIDE_HEAD,
                                                        LONG_WALK_STAGES, MAX_SPLITS, NVIDIA_PREFILL_DERIVED_WIDE,
                                                        PREFILL_TILES, ROCM_DECODE, ROCM_DECODE_HEAVY_GFX942,
                                                        ROCM_DECODE_WIDE, ROCM_PREFILL_HEAVY, SHORT_WALK,
                                                        SHORT_WALK_STAGES, WIDE_HEAD_DIM, AttnConfig)
from atomlite.model_ops.triton.common import (dependent_launches, dot_precision, gdc_wait, interpreting,
                                              is_power_of_two, num_sms, pdl_launch, platform_of, run_kernel)
from atomlite.model_ops.carriers import InputQuantization, QuantizedRows
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.attention import tuning

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _find_sequence(query_start_loc, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """Sequence b owns tiles [qsl[b] // BLOCK_Q + b, qsl[b + 1] // BLOCK_Q + b + 1): at least cdiv(Lq, BLOCK_Q)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _built_key_rows(built_rows, k_pos, stride_bk, dims, k_ok, MASKED: tl.constexpr):
    """The tile's keys from the step's built keys (one sequence's rows, contiguous by position)."""
    ptrs = built_rows + k_pos.to(tl.int64)[:, None] * stride_bk + dims[None, :]
    if MASKED:
        return tl.load(ptrs, mask=k_ok[:, None], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _derived_key_scores(q_plain, q_r1, q_r2, w_r1, w_r2, v_block, v_base, block, slot, k_pos, k_ok, cos, sin,
                        stride_vb, stride_vs, stride_rope, MASKED: tl.constexpr, HALF: tl.constexpr,
                        ROT: tl.constexpr, ROT_P: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """q . K for K = rope(V * w): the unrotated columns as (q * w) . V, plus the ROT rotated pairs, rebuilt from
    V's columns [0, ROT) and [HALF, HALF + ROT) at each key's position."""
    rdims = tl.arange(0, ROT_P)
    rmask = (rdims < ROT)[None, :] & (k_pos >= 0)[:, None]
    if MASKED:
        rmask &= k_ok[:, None]
    k1, k2 = _rotated_key_columns(v_base, block, slot, k_pos, rmask, w_r1, w_r2, cos, sin, stride_vb, stride_vs,
                                  stride_rope, HALF, ROT_P)
    k1 = k1.to(q_plain.dtype)
    k2 = k2.to(q_plain.dtype)
    scores = tl.dot(q_plain, tl.trans(v_block), input_precision=DOT_PRECISION)
    scores = tl.dot(q_r1, tl.trans(k1), scores, input_precision=DOT_PRECISION)
    return tl.dot(q_r2, tl.trans(k2), scores, input_precision=DOT_PRECISION)


@triton.jit
def _attend_tiles(acc, l_i, m_i, q_block, q_pos, q_key_end, k_base, v_base, table_row, tile_start, tile_end, k_lo,
                  k_hi, window, scale_log2, stride_kb, stride_ks, stride_vb, stride_vs,
                  q_r1, q_r2, w_r1, w_r2, cos, sin, stride_rope, built_rows, stride_bk,
                  MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KEY_ENDS: tl.constexpr,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, DERIVE_K: tl.constexpr, ROT: tl.constexpr, ROT_P: tl.constexpr,
                  KEYS_BUILT: tl.constexpr, value_lo, VALUE_DIM: tl.constexpr):
    """Online softmax over key tiles [tile_start, tile_end); scores in log2 units. With DERIVE_K, q_block is
    q * w_k with the rotated columns zeroed (see _derived_key_scores); with KEYS_BUILT, keys come from the step's
    built keys (built_rows) instead of the K cache. With HAS_KEY_ENDS a row sees keys before its q_key_end, else
    keys up to its q_pos. acc holds the VALUE_DIM output columns from value_lo (the whole head, or a part of it)."""
    dims = tl.arange(0, HEAD_DIM)
    value_dims = value_lo + tl.arange(0, VALUE_DIM)
    for kv_tile in range(tile_start, tile_end):
        k_pos = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        slot = k_pos % BLOCK_SIZE
        # Rows outside [k_lo, k_hi) may live in null or unwritten blocks: never load them.
        k_ok = (k_pos >= k_lo) & (k_pos < k_hi)
        if MASKED:
            block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        else:
            block = tl.load(table_row + k_pos // BLOCK_SIZE).to(tl.int64)
        # an fp8 cache (or any cache under the interpreter's fp32 upcast) computes in q's dtype
        if DERIVE_K:
            v_block = _key_rows(v_base, block, slot, stride_vb, stride_vs, dims, k_ok, MASKED).to(q_block.dtype)
            scores = _derived_key_scores(q_block, q_r1, q_r2, w_r1, w_r2, v_block, v_base, block, slot, k_pos,
                                         k_ok, cos, sin, stride_vb, stride_vs, stride_rope, MASKED,
                                         HEAD_DIM // 2, ROT, ROT_P, DOT_PRECISION)
            if VALUE_DIM < HEAD_DIM:  # the part's columns again, from cache
                v_block = _key_rows(v_base, block, slot, stride_vb, stride_vs, value_dims, k_ok, MASKED)
                v_block = v_block.to(q_block.dtype)
        else:
            v_block = _key_rows(v_base, block, slot, stride_vb, stride_vs, value_dims, k_ok, MASKED)
            v_block = v_block.to(q_block.dtype)
            if KEYS_BUILT:
                k_block = _built_key_rows(built_rows, k_pos, stride_bk, dims, k_ok, MASKED)
            else:
                k_block = _key_rows(k_base, block, slot, stride_kb, stride_ks, dims, k_ok, MASKED)
            scores = tl.dot(q_block, tl.trans(k_block.to(q_block.dtype)), input_precision=DOT_PRECISION)
        scores = scores * scale_log2
        if MASKED:
            if HAS_KEY_ENDS:
                visible = (k_pos[None, :] < q_key_end[:, None]) & k_ok[None, :]
            else:
                visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
            if HAS_WINDOW:
                visible &= (q_pos[:, None] - k_pos[None, :]) < window
            scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
        p = tl.exp2(scores - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        acc = tl.dot(p.to(v_block.dtype), v_block, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _tile_key_ends(key_ends, tokens, row_ok, q_pos, first_pos, q_end, k_len, HAS_KEY_ENDS: tl.constexpr):
    """(k_hi, seen_by_all, q_key_end): the end of the keys any row of the tile sees, the end of those every row sees
    (the window aside), and each row's own key end (its key_ends entry; q_pos, unused, without HAS_KEY_ENDS)."""
    k_hi = q_end
    seen_by_all = first_pos + 1
    q_key_end = q_pos
    if HAS_KEY_ENDS:
        q_key_end = tl.load(key_ends + tokens, mask=row_ok, other=0)
        k_hi = tl.minimum(k_len, tl.maximum(q_end, tl.max(q_key_end, 0)))
        seen_by_all = tl.minimum(tl.maximum(seen_by_all, tl.min(tl.where(row_ok, q_key_end, k_hi), 0)), k_hi)
    return k_hi, seen_by_all, q_key_end


@triton.jit
def _derived_query(q_block, q_rows, row_ok, k_weight, HEAD_DIM: tl.constexpr, ROT: tl.constexpr,
                   ROT_P: tl.constexpr):
    """For keys derived from V: (q * w_k with the rotated columns zeroed, q's rotated columns of each half, and
    w_k's). Folding w_k into q leaves the unrotated part of q . K a plain q . V."""
    dims = tl.arange(0, HEAD_DIM)
    w = tl.load(k_weight + dims).to(tl.float32)
    q_plain = tl.where(((dims % (HEAD_DIM // 2)) < ROT)[None, :], 0.0, q_block.to(tl.float32) * w[None, :])
    rdims = tl.arange(0, ROT_P)
    r_ok = rdims < ROT
    q_r1 = tl.load(q_rows + rdims[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
    q_r2 = tl.load(q_rows + HEAD_DIM // 2 + rdims[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
    w_r1 = tl.load(k_weight + rdims, mask=r_ok, other=0.0).to(tl.float32)
    w_r2 = tl.load(k_weight + HEAD_DIM // 2 + rdims, mask=r_ok, other=0.0).to(tl.float32)
    dtype = q_block.dtype
    return q_plain.to(dtype), q_r1.to(dtype), q_r2.to(dtype), w_r1, w_r2


# The batch's sequence count, split count and block-table width change from step to step: not specialized on (1,
# multiples of 16), since each new combination would be a compile in the middle of serving (bench/compile_misses.py).
@triton.jit(do_not_specialize=["num_seqs", "num_splits", "stride_bt"])
def _attention_kernel(
        q, k_cache, v_cache, out, lse, block_table, seq_lens, query_start_loc, k_weight, cos, sin, built_keys,
        built_row_starts, key_ends,
        scale_log2, v_scale, window, num_seqs, num_heads, num_splits,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_ot, stride_oh, stride_os, stride_ls, stride_bt, stride_rope, stride_bk,
        GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, HAS_WINDOW: tl.constexpr, STORE_LSE: tl.constexpr,
        SPLIT_KV: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, DERIVE_K: tl.constexpr,
        ROT: tl.constexpr, ROT_P: tl.constexpr, KEYS_BUILT: tl.constexpr, HAS_KEY_ENDS: tl.constexpr,
        PDL: tl.constexpr, VALUE_PARTS: tl.constexpr = 1, SOME_BUILT: tl.constexpr = False):
    """PDL: a dependent launch, which reads the batch's bounds (written before the step, by no kernel) while the
    kernel ahead (that wrote q and the new keys and values) finishes, and waits for it before q.
    VALUE_PARTS: programs (program_id(1) = kv_head * VALUE_PARTS + part) that each compute the whole scores but
    only HEAD_DIM / VALUE_PARTS output columns, so that a wide head's accumulator fits the registers.
    SOME_BUILT: built_row_starts is -1 for the sequences whose keys were not built: a KEYS_BUILT launch skips them,
    a DERIVE_K launch takes them alone."""
    # Last tiles first: under a causal mask they have the most keys, so the long programs start early.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1) // VALUE_PARTS
    value_lo = (tl.program_id(1) % VALUE_PARTS) * (HEAD_DIM // VALUE_PARTS)
    split = tl.program_id(2)
    seq = _find_sequence(query_start_loc, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    q_tile = tile - (q_start // BLOCK_Q + seq)
    k_len = tl.load(seq_lens + seq)
    if PDL:
        gdc_wait()  # every program, the idle ones too: this grid ends after the kernel ahead
    if q_tile * BLOCK_Q >= q_len:
        return
    if SOME_BUILT:
        if KEYS_BUILT:
            if tl.load(built_row_starts + seq) < 0:
                return
        elif tl.load(built_row_starts + seq) >= 0:
            return

    rows = tl.arange(0, BLOCK_M)
    q_local = q_tile * BLOCK_Q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (q_local < q_len) & (rows < BLOCK_Q * GROUP)
    q_pos = k_len - q_len + q_local
    dims = tl.arange(0, HEAD_DIM)
    q_rows = q + (q_start + q_local)[:, None] * stride_qt + head[:, None] * stride_qh
    q_block = tl.load(q_rows + dims[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q_block = q_block.to(tl.float32)
    if DERIVE_K:
        q_block, q_r1, q_r2, w_r1, w_r2 = _derived_query(q_block, q_rows, row_ok, k_weight, HEAD_DIM, ROT, ROT_P)
    else:
        q_r1 = q_block
        q_r2 = q_block
        w_r1 = dims
        w_r2 = dims

    first_pos = k_len - q_len + q_tile * BLOCK_Q
    q_end = tl.minimum(k_len, first_pos + BLOCK_Q)  # one past the tile's last query position
    k_hi, seen_by_all, q_key_end = _tile_key_ends(key_ends, q_start + q_local, row_ok, q_pos, first_pos, q_end,
                                                  k_len, HAS_KEY_ENDS)
    k_lo = 0
    if HAS_WINDOW:
        k_lo = tl.maximum(first_pos - window + 1, 0)
    tile_lo = k_lo // BLOCK_N
    tile_hi = tl.cdiv(k_hi, BLOCK_N)
    if SPLIT_KV:
        per_split = tl.cdiv(tile_hi - tile_lo, num_splits)
        tile_lo = tile_lo + split * per_split
        tile_hi = tl.minimum(tile_hi, tile_lo + per_split)

    # Tiles [tile_lo, full_lo) and [full_hi, tile_hi) cut the window edge or the diagonal (or a row's key end) and
    # need masks; tiles between are visible to every row and skip both the mask and the bounds checks.
    last_pos = q_end - 1
    full_lo = tile_lo
    if HAS_WINDOW:
        full_lo = tl.cdiv(tl.maximum(last_pos - window + 1, 0), BLOCK_N)
    full_lo = tl.minimum(tl.maximum(full_lo, tile_lo), tile_hi)
    full_hi = tl.minimum(tl.maximum(seen_by_all // BLOCK_N, full_lo), tile_hi)

    # A finite start keeps fully masked rows NaN-free: exp2(-inf - (-1e30)) = 0.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM // VALUE_PARTS], dtype=tl.float32)
    table_row = block_table + seq * stride_bt
    built_rows = built_keys
    if KEYS_BUILT:
        built_rows = built_keys + tl.load(built_row_starts + seq).to(tl.int64) * stride_bk + kv_head * HEAD_DIM
    k_base = k_cache + kv_head * stride_kh
    v_base = v_cache + kv_head * stride_vh
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q_block, q_pos, q_key_end, k_base, v_base, table_row, tile_lo, full_lo, k_lo, k_hi,
        window, scale_log2, stride_kb, stride_ks, stride_vb, stride_vs, q_r1, q_r2, w_r1, w_r2, cos, sin,
        stride_rope, built_rows, stride_bk,
        True, HAS_WINDOW, HAS_KEY_ENDS, BLOCK_N, HEAD_DIM, BLOCK_SIZE, UPCAST, DOT_PRECISION, DERIVE_K, ROT, ROT_P,
        KEYS_BUILT, value_lo, HEAD_DIM // VALUE_PARTS)
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q_block, q_pos, q_key_end, k_base, v_base, table_row, full_lo, full_hi, k_lo, k_hi,
        window, scale_log2, stride_kb, stride_ks, stride_vb, stride_vs, q_r1, q_r2, w_r1, w_r2, cos, sin,
        stride_rope, built_rows, stride_bk,
        False, HAS_WINDOW, HAS_KEY_ENDS, BLOCK_N, HEAD_DIM, BLOCK_SIZE, UPCAST, DOT_PRECISION, DERIVE_K, ROT, ROT_P,
        KEYS_BUILT, value_lo, HEAD_DIM // VALUE_PARTS)
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q_block, q_pos, q_key_end, k_base, v_base, table_row, full_hi, tile_hi, k_lo, k_hi,
        window, scale_log2, stride_kb, stride_ks, stride_vb, stride_vs, q_r1, q_r2, w_r1, w_r2, cos, sin,
        stride_rope, built_rows, stride_bk,
        True, HAS_WINDOW, HAS_KEY_ENDS, BLOCK_N, HEAD_DIM, BLOCK_SIZE, UPCAST, DOT_PRECISION, DERIVE_K, ROT, ROT_P,
        KEYS_BUILT, value_lo, HEAD_DIM // VALUE_PARTS)

    empty = l_i == 0.0
    acc = acc * (v_scale / tl.where(empty, 1.0, l_i))[:, None]  # an fp8 cache's V scale
    token = q_start + q_local
    value_dims = value_lo + tl.arange(0, HEAD_DIM // VALUE_PARTS)
    out_ptrs = out + split * stride_os + token[:, None] * stride_ot + head[:, None] * stride_oh + value_dims[None, :]
    tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=row_ok[:, None])
    if STORE_LSE:
        if value_lo == 0:  # every part has the same softmax sums
            row_lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
            lse_ptrs = lse + split * stride_ls + token * num_heads + head
            tl.store(lse_ptrs, row_lse, mask=row_ok)


def decode_like(num_tokens: int, num_seqs: int, max_query_len: int | None) -> bool:
    """A few queries per sequence (decode; a verify step's newest token and drafts): split-KV tiles. Without the
    host's longest query, the mean query length decides."""
    if max_query_len is not None:
        return max_query_len <= DECODE_MAX_QUERY_LEN
    return num_tokens <= DECODE_QUERIES_PER_SEQ * num_seqs


def pick_config(q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor, group: int,
                derive_k: bool = False, window: int | None = None, max_query_len: int | None = None) -> AttnConfig:
    """Tile shapes by head_dim and batch shape (tuning.py); decode-like batches get split-KV."""
    head_dim, num_tokens, num_seqs = q.shape[2], q.shape[0], block_table.shape[0]
    wide = q.element_size() > 2 or interpreting()
    platform = platform_of(q.device)
    # Rebuilding keys from V, or widening an fp8 cache, holds more per lane: AMD takes smaller tiles there.
    heavy = platform.kind == "rocm" and (derive_k or cache.element_size() == 1)
    if decode_like(num_tokens, num_seqs, max_query_len):
        num_pairs, max_keys = num_seqs * cache.shape[2], block_table.shape[1] * cache.shape[1]
        if platform.kind == "rocm":
            tiles = (ROCM_DECODE_HEAVY_GFX942 if heavy and platform.arch == "gfx942"
                     else ROCM_DECODE_WIDE if head_dim >= WIDE_HEAD_DIM or wide else ROCM_DECODE)
            splits = split_kv.num_splits(q.device, num_pairs, max_keys, tiles.block_n)
            return dataclasses.replace(tiles, num_splits=splits)
        rows = group * (max_query_len or 1)
        return _decode_config(q.device, head_dim, wide, num_pairs, min(max_keys, window or max_keys), rows)
    if heavy:
        return ROCM_PREFILL_HEAVY
    if derive_k and head_dim >= WIDE_HEAD_DIM and not wide and platform.kind == "cuda":
        return NVIDIA_PREFILL_DERIVED_WIDE
    _, fast, small = next(row for row in PREFILL_TILES if head_dim >= row[0])
    return small if wide or platform.kind == "rocm" else fast


def _decode_config(device: torch.device, head_dim: int, wide: bool, num_pairs: int, keys: int,
                   rows: int = 1) -> AttnConfig:
    """Split-KV decode tiles on NVIDIA: a split walks up to SHORT_WALK key tiles unpipelined, or more with
    LONG_WALK_STAGES (tuning.py). keys: the most keys a query sees (the table's width, or the window). rows: a
    sequence's queries times the GQA group, which one program takes whole up to DECODE_MAX_BLOCK_M (each key tile
    then loaded once for all of them). Wide heads with more programs than multiprocessors take tiles two of which
    share one (DECODE_SHARED_WIDE_HEAD), where a program holds one query's rows (a verify step's 64-row accumulator
    of 512 columns needs the 8 warps); other heads take DECODE_WARPS_ALONE where each program has a multiprocessor
    to itself."""
    wide_head = head_dim >= WIDE_HEAD_DIM
    block_n = DECODE_BLOCK_N_WIDE_VALUES if wide else DECODE_BLOCK_N
    splits = split_kv.num_splits(device, num_pairs, keys, block_n, min_tiles=DECODE_MIN_TILES_PER_SPLIT,
                                 max_splits=DECODE_WIDE_HEAD_MAX_SPLITS if wide_head else MAX_SPLITS)
    walk = triton.cdiv(keys, block_n * splits)
    block_m = max(DECODE_BLOCK_M, min(DECODE_MAX_BLOCK_M, triton.next_power_of_2(rows)))
    alone = num_pairs * splits <= num_sms(device)  # each program has a multiprocessor to itself
    if wide_head and not wide and block_m == DECODE_BLOCK_M and not alone:
        return AttnConfig(block_m, *DECODE_SHARED_WIDE_HEAD, splits)
    if wide_head:
        warps = DECODE_WARPS_WIDE_HEAD
    else:
        warps = DECODE_WARPS_ALONE if alone else DECODE_WARPS
    return AttnConfig(block_m, block_n, warps, SHORT_WALK_STAGES if walk <= SHORT_WALK else LONG_WALK_STAGES, splits)


def launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, window, return_lse,
           config: AttnConfig, k_from_v: KFromV | None = None, built: BuiltKeys | None = None, v_scale: float = 1.0,
           quantize: InputQuantization | None = None, key_ends: torch.Tensor | None = None,
           derive_unbuilt: bool = False, into: tuple[torch.Tensor, torch.Tensor | None] | None = None):
    """built: keys built for the step from V (then k_from_v only names the layer's rule; the kernel reads them);
    where built.partial, only the sequences built, or with derive_unbuilt only the others, keys derived from V.
    into: (out, lse) to write the queries' rows of (those of the sequences this launch takes), else new ones.
    scale: the softmax scale times the K cache's scale; v_scale: the V cache's (outputs are multiplied by it).
    quantize: where the split-KV merge writes the output, it writes it as [T, H * D] QuantizedRows of that form
    (returned instead of out) when the form's K is H * D and D a multiple of 32 (whole blocks per head).
    key_ends: [T] int32, each query's exclusive end of visible keys (ForwardContext.key_ends); None: causal."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = v_cache.shape[2], v_cache.shape[1]
    group = num_heads // num_kv_heads
    num_seqs = block_table.shape[0]
    if q.stride(2) != 1:
        q = q.contiguous()
    if into is not None:
        out, lse = into
    else:
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
        lse = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=q.device) if return_lse else None
    if num_tokens == 0 or num_seqs == 0:
        return (out, lse) if return_lse else out
    block_m = max(config.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    splits = config.num_splits
    if splits > 1:
        part_out = torch.empty((splits, num_tokens, num_heads, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((splits, num_tokens, num_heads), dtype=torch.float32, device=q.device)
        dest, dest_lse = part_out, part_lse
    else:
        dest, dest_lse = out, lse
    grid = (num_tokens // block_q + num_seqs, num_kv_heads * config.value_parts, splits)
    some_built = built is not None and built.partial
    assert not some_built or splits == 1, "partly built keys are a prefill's: no split-KV"
    derive = k_from_v is not None and (built is None or derive_unbuilt)
    if derive:
        k_cache, k_weight, cos, sin, rot = v_cache, k_from_v.weight, k_from_v.cos, k_from_v.sin, k_from_v.rotary_pairs
    else:
        k_weight = cos = sin = q  # never read
        rot = 0
    k_cache = v_cache if k_cache is None else k_cache  # never read without a K cache
    built_keys, built_row_starts = (built.keys, built.row_starts) if built is not None else (q, seq_lens)
    pdl = dependent_launches(q.device)
    run_kernel(_attention_kernel, grid,
        q, k_cache, v_cache, dest, dest_lse if dest_lse is not None else dest, block_table, seq_lens,
        query_start_loc, k_weight, cos, sin, built_keys, built_row_starts,
        key_ends if key_ends is not None else seq_lens, scale * LOG2E, v_scale, window or 0,
        num_seqs, num_heads, splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        dest.stride(-3), dest.stride(-2), dest.stride(0) if splits > 1 else 0,
        dest_lse.stride(0) if splits > 1 else 0, block_table.stride(0), cos.stride(0), built_keys.stride(0),
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=config.block_n, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, HAS_WINDOW=window is not None, STORE_LSE=return_lse or splits > 1,
        SPLIT_KV=splits > 1, UPCAST=interpreting(), DOT_PRECISION=dot_precision(q.dtype),
        DERIVE_K=derive, ROT=rot, ROT_P=rotated_width(rot), KEYS_BUILT=built is not None and not derive,
        HAS_KEY_ENDS=key_ends is not None, PDL=pdl, VALUE_PARTS=config.value_parts, SOME_BUILT=some_built,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl_launch(pdl))
    if splits > 1:
        quantized = None
        if quantize is not None and quantize.k_padded == num_heads * head_dim and head_dim % 32 == 0:
            quantized = QuantizedRows.empty(num_tokens, quantize, q.dtype, q.device)
        split_kv.combine(part_out, part_lse, out, lse, quantized)
        out = out if quantized is None else quantized
    return (out, lse) if return_lse else out


def step_metadata(ctx: ForwardContext, group: GroupBatch, spec: KVSpec, block_size: int) -> torch.Tensor | None:
    """Per step and KV group: where each sequence's rows start among the keys a prefill on V-only layers without a
    window builds once (_keys_for_prefill); None where no layer of the group builds them."""
    host = ctx.host
    if (not spec.k_from_v or spec.window is not None or host is None or host.seq_lens is None
            or decode_like(0, 0, host.max_query_len)):
        return None
    return key_row_starts(host.seq_lens, group.block_table.device)


def _keys_for_prefill(q, v_cache, block_table, seq_lens, query_start_loc, k_from_v: KFromV,
                      host: HostBatch | None, derived: object | None) -> BuiltKeys | None:
    """A prefill's query tiles would each rebuild the same keys (H200, 31B's global layer at 2048 tokens: 1.59 ms
    against 0.64 built): build them once where they take no more memory than q (so the forward's measured
    activation peak covers them). With the host's lengths, all of them or none; without (a prefill graph), those
    of the prefilling sequences that fit, planned on the device. Decode builds in the kernel: one tile per key
    either way. derived: step_metadata's row starts, else they are made here."""
    if host is None or decode_like(0, 0, host.max_query_len):
        return None
    dtype = torch.float32 if interpreting() else q.dtype  # the interpreter computes in fp32 (UPCAST)
    if host.seq_lens is None:
        capacity = q.numel() // (v_cache.shape[2] * v_cache.shape[3])
        return build_step_keys(v_cache, block_table, seq_lens, query_start_loc, capacity, k_from_v, dtype)
    total = sum(host.seq_lens)
    if total * v_cache.shape[2] * v_cache.shape[3] > q.numel():
        return None
    row_starts = derived if isinstance(derived, torch.Tensor) else key_row_starts(host.seq_lens, q.device)
    return build_keys(v_cache, block_table, seq_lens, row_starts, total, host.max_seq_len, k_from_v, dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    window: int | None = None, return_lse: bool = False, k_from_v: KFromV | None = None,
                    host: HostBatch | None = None, derived: object | None = None,
                    kv_scales: tuple[float, float] = UNIT_SCALES, quantize: InputQuantization | None = None,
                    key_ends: torch.Tensor | None = None):
    """Same contract as torch_ref.paged_attention; reads lengths on the device. host (and derived, what
    step_metadata built for the step) let a prefill on V-only layers build its keys once (_keys_for_prefill).
    quantize: see launch (the output may come as QuantizedRows)."""
    group = q.shape[1] // v_cache.shape[2]
    built = None
    if k_from_v is not None and window is None:
        built = _keys_for_prefill(q, v_cache, block_table, seq_lens, query_start_loc, k_from_v, host, derived)
    max_query_len = host.max_query_len if host is not None else None
    config = pick_config(q, v_cache, block_table, group, derive_k=k_from_v is not None and built is None,
                         window=window, max_query_len=max_query_len)
    k_scale, v_scale = cache_scales(v_cache, kv_scales)
    key_scale = k_scale if k_from_v is None else v_scale  # keys rebuilt from V carry V's scale
    args = (q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale * key_scale, window, return_lse)
    result = launch(*args, config, k_from_v, built, v_scale, quantize, key_ends)
    if built is not None and built.partial:  # the sequences not built, into the same rows
        derive_config = pick_config(q, v_cache, block_table, group, derive_k=True, max_query_len=max_query_len)
        launch(*args, derive_config, k_from_v, built, v_scale, quantize, key_ends, derive_unbuilt=True,
               into=result if return_lse else (result, None))
    return result


paged_attention.step_metadata = step_metadata


MAX_HEAD_DIM = 512
MAX_GQA_GROUP = 64
MIN_K_FROM_V_HEAD_DIM = 32  # the rotated columns of each half are read as tiles of at least 16


def _refuses(platform, shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    if head_dim is not None and not (is_power_of_two(head_dim) and 16 <= head_dim <= MAX_HEAD_DIM):
        return f"head_dim {head_dim} is not a power of two in [16, {MAX_HEAD_DIM}]"
    if shape.get("gqa", 1) > MAX_GQA_GROUP:
        return f"{shape['gqa']} query heads per KV head exceed {MAX_GQA_GROUP}"
    if shape.get("k_from_v") and head_dim is not None and head_dim < MIN_K_FROM_V_HEAD_DIM:
        return f"keys derived from V need head_dim >= {MIN_K_FROM_V_HEAD_DIM} (got {head_dim})"
    return None


# writes_quantized_rows from its split-KV merge; graphs_multi_query: the batch is found on the device
declare("attention", "triton", paged_attention, refuses=_refuses, tuning=tuning,
        capabilities={"writes_quantized_rows", "graphs_multi_query"})
