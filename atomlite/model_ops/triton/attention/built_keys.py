"""Keys rebuilt from V, once for a step, on layers that store V alone (K = rope(V * w), model_ops.k_from_v): the
prefill's query tiles of paged attention then read them (KEYS_BUILT) instead of each rebuilding the same keys.
build_keys lays out every sequence of a step the host knows; build_step_keys plans on the device, for a prefill
graph, whose host knows no lengths. Also the cache-row loads paged attention shares with them."""
import itertools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.k_from_v import KFromV
from atomlite.model_ops.triton.attention.tuning import BUILD_KEYS_BLOCK, BUILD_KEYS_WARPS, DECODE_MAX_QUERY_LEN
from atomlite.model_ops.triton.common import run_kernel


@triton.jit
def _key_rows(base, block, slot, stride_b, stride_s, dims, k_ok, MASKED: tl.constexpr):
    """Rows of one KV head for the tile's keys; masked rows (null or unwritten blocks) are never loaded."""
    ptrs = base + block[:, None] * stride_b + slot[:, None] * stride_s + dims[None, :]
    if MASKED:
        return tl.load(ptrs, mask=k_ok[:, None], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _rotated_key_columns(v_base, block, slot, k_pos, rmask, w_r1, w_r2, cos, sin, stride_vb, stride_vs,
                         stride_rope, HALF: tl.constexpr, ROT_P: tl.constexpr):
    """K's rotated columns [0, ROT) and [HALF, HALF + ROT) at each key's position, from V's (fp32)."""
    rdims = tl.arange(0, ROT_P)
    rows = v_base + block[:, None] * stride_vb + slot[:, None] * stride_vs + rdims[None, :]
    x1 = tl.load(rows, mask=rmask, other=0.0).to(tl.float32) * w_r1[None, :]
    x2 = tl.load(rows + HALF, mask=rmask, other=0.0).to(tl.float32) * w_r2[None, :]
    table = k_pos[:, None] * stride_rope + rdims[None, :]
    c = tl.load(cos + table, mask=rmask, other=1.0)
    s = tl.load(sin + table, mask=rmask, other=0.0)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _build_keys_kernel(v_cache, block_table, seq_lens, row_starts, k_weight, cos, sin, out, stride_vb, stride_vs,
                       stride_vh, stride_bt, stride_rope, stride_ok, HEAD_DIM: tl.constexpr, ROT: tl.constexpr,
                       ROT_P: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr):
    """K = rope(V * w) for BLOCK_T positions of one sequence and KV head, into its rows of out."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(2)
    k_pos = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    k_ok = k_pos < tl.load(seq_lens + seq)
    block = tl.load(block_table + seq * stride_bt + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
    rows = out + (tl.load(row_starts + seq) + k_pos.to(tl.int64))[:, None] * stride_ok + kv_head * HEAD_DIM
    _store_keys(v_cache + kv_head * stride_vh, block, k_pos, k_ok, rows, k_weight, cos, sin, stride_vb, stride_vs,
                stride_rope, HEAD_DIM, ROT, ROT_P, BLOCK_SIZE)


@triton.jit
def _build_step_keys_kernel(v_cache, block_table, seq_lens, query_start_loc, row_starts, k_weight, cos, sin, out,
                            num_seqs, capacity, stride_vb, stride_vs, stride_vh, stride_bt, stride_rope, stride_ok,
                            MIN_QUERY_LEN: tl.constexpr, SEQS_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                            ROT: tl.constexpr, ROT_P: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr):
    """build_step_keys on the device alone: every program plans the step (the sequences of at least MIN_QUERY_LEN
    queries, in order, while their keys fit capacity rows), program (0, 0) writes each one's first row (-1: not
    built), and each program builds BLOCK_T rows of the plan for one KV head."""
    kv_head = tl.program_id(1)
    seqs = tl.arange(0, SEQS_P2)
    s_ok = seqs < num_seqs
    q_len = (tl.load(query_start_loc + seqs + 1, mask=s_ok, other=0)
             - tl.load(query_start_loc + seqs, mask=s_ok, other=0))
    need = tl.where(s_ok & (q_len >= MIN_QUERY_LEN), tl.load(seq_lens + seqs, mask=s_ok, other=0), 0).to(tl.int64)
    ends = tl.cumsum(need, 0)
    fits = ends <= capacity
    if (tl.program_id(0) == 0) & (kv_head == 0):
        tl.store(row_starts + seqs, tl.where(fits & (need > 0), ends - need, -1), mask=s_ok)
    row = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    passed = ends[None, :] <= row[:, None]  # the sequences wholly before each row
    seq = tl.minimum(tl.sum(passed.to(tl.int32), 1), num_seqs - 1)
    k_pos = row - tl.max(tl.where(passed, ends[None, :], 0), 1)
    k_ok = row < tl.max(tl.where(fits, ends, 0), 0)
    block = tl.load(block_table + seq * stride_bt + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
    rows = out + row[:, None] * stride_ok + kv_head * HEAD_DIM
    _store_keys(v_cache + kv_head * stride_vh, block, k_pos, k_ok, rows, k_weight, cos, sin, stride_vb, stride_vs,
                stride_rope, HEAD_DIM, ROT, ROT_P, BLOCK_SIZE)


@triton.jit
def _store_keys(v_base, block, k_pos, k_ok, rows, k_weight, cos, sin, stride_vb, stride_vs, stride_rope,
                HEAD_DIM: tl.constexpr, ROT: tl.constexpr, ROT_P: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """K = rope(V * w) of the keys at k_pos (in cache blocks `block`) into rows (one row pointer a key)."""
    slot = k_pos % BLOCK_SIZE
    dims = tl.arange(0, HEAD_DIM)
    unrotated = (dims % (HEAD_DIM // 2)) >= ROT  # columns stored as V * w; the others are written below, rotated
    plain = _key_rows(v_base, block, slot, stride_vb, stride_vs, dims, k_ok, True).to(tl.float32)
    plain *= tl.load(k_weight + dims).to(tl.float32)[None, :]
    tl.store(rows + dims[None, :], plain.to(rows.dtype.element_ty), mask=k_ok[:, None] & unrotated[None, :])
    rdims = tl.arange(0, ROT_P)
    r_ok = rdims < ROT
    rmask = k_ok[:, None] & r_ok[None, :]
    w_r1 = tl.load(k_weight + rdims, mask=r_ok, other=0.0).to(tl.float32)
    w_r2 = tl.load(k_weight + HEAD_DIM // 2 + rdims, mask=r_ok, other=0.0).to(tl.float32)
    k1, k2 = _rotated_key_columns(v_base, block, slot, k_pos, rmask, w_r1, w_r2, cos, sin, stride_vb, stride_vs,
                                  stride_rope, HEAD_DIM // 2, ROT_P)
    tl.store(rows + rdims[None, :], k1.to(rows.dtype.element_ty), mask=rmask)
    tl.store(rows + HEAD_DIM // 2 + rdims[None, :], k2.to(rows.dtype.element_ty), mask=rmask)


@dataclass(frozen=True)
class BuiltKeys:
    """K of every key of a step on a V-only layer, built once: keys [sum of seq_lens, kv_heads, head_dim],
    sequence b's rows (by position) from row_starts[b]. partial: row_starts is -1 for the sequences not built
    (build_step_keys), whose keys the attention derives from V itself."""
    keys: torch.Tensor
    row_starts: torch.Tensor
    partial: bool = False


def rotated_width(rotary_pairs: int) -> int:
    """ROT_P: the rotated columns of each half, padded to a tile the dot accepts."""
    return max(16, triton.next_power_of_2(rotary_pairs))


def build_keys(v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, row_starts: torch.Tensor,
               total_keys: int, max_seq_len: int, k_from_v: KFromV, dtype: torch.dtype) -> BuiltKeys:
    """K = rope(V * w) of every key of the batch's sequences, from the V cache."""
    num_seqs, (_, block_size, num_kv_heads, head_dim) = block_table.shape[0], v_cache.shape
    keys = torch.empty((total_keys, num_kv_heads, head_dim), dtype=dtype, device=v_cache.device)
    if total_keys and num_seqs:
        grid = (num_seqs, triton.cdiv(max_seq_len, BUILD_KEYS_BLOCK), num_kv_heads)
        run_kernel(_build_keys_kernel, grid, v_cache, block_table, seq_lens, row_starts, k_from_v.weight,
                   k_from_v.cos, k_from_v.sin, keys, v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                   block_table.stride(0), k_from_v.cos.stride(0), keys.stride(0), HEAD_DIM=head_dim,
                   ROT=k_from_v.rotary_pairs, ROT_P=rotated_width(k_from_v.rotary_pairs), BLOCK_SIZE=block_size,
                   BLOCK_T=BUILD_KEYS_BLOCK, num_warps=BUILD_KEYS_WARPS)
    return BuiltKeys(keys, row_starts)


def build_step_keys(v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, capacity: int, k_from_v: KFromV, dtype: torch.dtype) -> BuiltKeys:
    """K = rope(V * w) of the prefilling sequences (more than DECODE_MAX_QUERY_LEN queries), in order, while their
    keys fit capacity rows, planned on the device (a prefill graph's host knows no lengths): a partial BuiltKeys.
    Decode rows gain nothing from built keys (one tile per key either way)."""
    num_seqs, (_, block_size, num_kv_heads, head_dim) = block_table.shape[0], v_cache.shape
    keys = torch.empty((capacity, num_kv_heads, head_dim), dtype=dtype, device=v_cache.device)
    row_starts = torch.empty(num_seqs, dtype=torch.int64, device=v_cache.device)
    grid = (max(1, triton.cdiv(capacity, BUILD_KEYS_BLOCK)), num_kv_heads)
    run_kernel(_build_step_keys_kernel, grid, v_cache, block_table, seq_lens, query_start_loc, row_starts,
               k_from_v.weight, k_from_v.cos, k_from_v.sin, keys, num_seqs, capacity, v_cache.stride(0),
               v_cache.stride(1), v_cache.stride(2), block_table.stride(0), k_from_v.cos.stride(0), keys.stride(0),
               MIN_QUERY_LEN=DECODE_MAX_QUERY_LEN + 1, SEQS_P2=triton.next_power_of_2(num_seqs), HEAD_DIM=head_dim,
               ROT=k_from_v.rotary_pairs, ROT_P=rotated_width(k_from_v.rotary_pairs), BLOCK_SIZE=block_size,
               BLOCK_T=BUILD_KEYS_BLOCK, num_warps=BUILD_KEYS_WARPS)
    return BuiltKeys(keys, row_starts, partial=True)


def key_row_starts(seq_lens: list[int], device: torch.device) -> torch.Tensor:
    """Where each sequence's rows start in build_keys' output: the lengths' exclusive prefix sums."""
    return torch.tensor([0, *itertools.accumulate(seq_lens[:-1])], dtype=torch.int64).to(device, non_blocking=True)
