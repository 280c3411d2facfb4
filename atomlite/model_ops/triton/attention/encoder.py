"""Encoder attention: every row of a packed sequence attends to every row of the same sequence (bidirectional, no KV
cache), none of the sequences packed beside it. A vision tower's images, up to 10080 patches each.

Each program owns BLOCK_Q rows of one sequence times the GROUP query heads that share one KV head, stacked into
BLOCK_M rows, and walks the sequence's keys in BLOCK_N tiles with an online softmax in fp32: no [T, T] score matrix
is ever made. Programs find their sequence by binary search over cu_seqlens, so nothing is read back to the host
(one launch for the whole pack, graph-capturable). Head dims that are not a power of two (the 31B tower's 72) are
padded to one, the padded columns masked on every load and store.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.triton.attention.paged import LOG2E, _find_sequence
from atomlite.model_ops.triton.attention.tuning import ENCODER_TILES, AttnConfig
from atomlite.model_ops.triton.common import dot_precision, interpreting, platform_of, run_kernel


@triton.jit
def _rows(base, rows, stride, dims, row_ok, HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr,
          MASK_DIMS: tl.constexpr):
    """base[rows, :HEAD_DIM] as a [rows, HEAD_DIM_P] tile, zero where masked (rows past the sequence, padded dims)."""
    ptrs = base + rows.to(tl.int64)[:, None] * stride + dims[None, :]
    if MASK_ROWS and MASK_DIMS:
        return tl.load(ptrs, mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    if MASK_ROWS:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    if MASK_DIMS:
        return tl.load(ptrs, mask=(dims < HEAD_DIM)[None, :], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _attend_keys(acc, l_i, m_i, q_block, k_base, v_base, tile_start, tile_end, length, scale_log2, stride_kt,
                 stride_vt, MASKED: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 HEAD_DIM_P: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key tiles [tile_start, tile_end) of one sequence; scores in log2 units. MASKED: the
    tiles may run past the sequence's end."""
    dims = tl.arange(0, HEAD_DIM_P)
    for kv_tile in range(tile_start, tile_end):
        keys = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = keys < length
        k_block = _rows(k_base, keys, stride_kt, dims, key_ok, HEAD_DIM, MASKED, HEAD_DIM != HEAD_DIM_P)
        v_block = _rows(v_base, keys, stride_vt, dims, key_ok, HEAD_DIM, MASKED, HEAD_DIM != HEAD_DIM_P)
        # the interpreter's fp32 upcast: q is fp32, so keys and values follow it
        k_block = k_block.to(q_block.dtype)
        v_block = v_block.to(q_block.dtype)
        scores = tl.dot(q_block, tl.trans(k_block), input_precision=DOT_PRECISION) * scale_log2
        if MASKED:
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v_block.dtype), v_block, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# The pack's sequence count changes from call to call: not specialized on (1, multiples of 16), so a new image count
# is no new compile.
@triton.jit(do_not_specialize=["num_seqs"])
def _encoder_attention_kernel(
        q, k, v, out, cu_seqlens, scale_log2, num_seqs,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(cu_seqlens, tile, num_seqs, BLOCK_Q)
    start = tl.load(cu_seqlens + seq)
    length = tl.load(cu_seqlens + seq + 1) - start
    q_tile = tile - (start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q >= length:
        return

    rows = tl.arange(0, BLOCK_M)
    q_local = q_tile * BLOCK_Q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (q_local < length) & (rows < BLOCK_Q * GROUP)
    dims = tl.arange(0, HEAD_DIM_P)
    token = start.to(tl.int64) + q_local
    q_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    q_ptrs = q + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q_block = tl.load(q_ptrs, mask=q_mask, other=0.0)
    if UPCAST:
        q_block = q_block.to(tl.float32)

    # A finite start keeps the masked rows NaN-free: exp2(-inf - (-1e30)) = 0.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    k_base = k + start.to(tl.int64) * stride_kt + kv_head * stride_kh
    v_base = v + start.to(tl.int64) * stride_vt + kv_head * stride_vh
    full_tiles = length // BLOCK_N  # every key of these is the sequence's: no key mask
    acc, l_i, m_i = _attend_keys(acc, l_i, m_i, q_block, k_base, v_base, 0, full_tiles, length, scale_log2,
                                 stride_kt, stride_vt, False, BLOCK_N, HEAD_DIM, HEAD_DIM_P, DOT_PRECISION)
    acc, l_i, m_i = _attend_keys(acc, l_i, m_i, q_block, k_base, v_base, full_tiles, tl.cdiv(length, BLOCK_N),
                                 length, scale_log2, stride_kt, stride_vt, True, BLOCK_N, HEAD_DIM, HEAD_DIM_P,
                                 DOT_PRECISION)

    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_ptrs = out + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=q_mask)


def padded_head_dim(head_dim: int) -> int:
    """The tile width a head is computed in: a power of two, at least the 16 a dot takes."""
    return max(16, triton.next_power_of_2(head_dim))


def pick_config(q: torch.Tensor) -> AttnConfig:
    """Tiles by padded head_dim and platform (tuning.ENCODER_TILES); 4-byte values (fp32, or any dtype under the
    interpreter) take the smaller ones."""
    _, nvidia, rocm, four_byte = next(row for row in ENCODER_TILES if padded_head_dim(q.shape[2]) >= row[0])
    if q.element_size() > 2 or interpreting():
        return four_byte
    return rocm if platform_of(q.device).kind == "rocm" else nvidia


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedSequences,
                      scale: float) -> torch.Tensor:
    """Same contract as torch_ref.encoder_attention; the sequences' bounds are read on the device (one launch)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    num_seqs = packed.cu_seqlens.shape[0] - 1
    q, k, v = (t if t.stride(2) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    config = pick_config(q)
    block_m = max(config.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    run_kernel(_encoder_attention_kernel, grid,
               q, k, v, out, packed.cu_seqlens, scale * LOG2E, num_seqs,
               q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               out.stride(0), out.stride(1),
               GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=config.block_n, HEAD_DIM=head_dim,
               HEAD_DIM_P=padded_head_dim(head_dim), UPCAST=interpreting(), DOT_PRECISION=dot_precision(q.dtype),
               num_warps=config.num_warps, num_stages=config.num_stages)
    return out
