"""Encoder attention: every row of a packed sequence attends to every row of the same sequence (bidirectional, no KV
cache), none of the sequences packed beside it. A vision tower's images, up to 10080 patches each.

Each program owns BLOCK_Q rows of one sequence times the GROUP query heads that share one KV head, stacked into
BLOCK_M rows, and walks the sequence's keys in BLOCK_N tiles with an online softmax in fp32: no [T, T] score matrix
is ever made. Programs find their sequence by binary search over cu_seqlens, so nothing is read back to the host
(one launch for the whole pack, graph-capturable). A head_dim that is not a power of two (the 31B tower's 72) is either
padded whole to one (128, the padded columns masked on every load and store), or split into two parts, each a power
of two (64 + 16, the last 8 columns masked): QK^T is the sum of two dots and P.V fills two accumulators, 80 columns of
dot work against 128 (tuning.ENCODER_SPLIT_HEADS says where).
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.triton.attention.paged import LOG2E, _find_sequence
from atomlite.model_ops.triton.attention.tuning import ENCODER_MAX_HEAD_DIM, ENCODER_SPLIT_HEADS, ENCODER_TILES, AttnConfig
from atomlite.model_ops.triton.common import dot_precision, interpreting, platform_of, run_kernel
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.attention import tuning
from atomlite.model_ops.triton.attention.paged import MAX_GQA_GROUP


@triton.jit
def _rows(base, rows, stride, dims, row_ok, HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr,
          MASK_DIMS: tl.constexpr):
    """base[rows, dims] as a [rows, len(dims)] tile, zero where masked (rows past the sequence, dims past HEAD_DIM)."""
    ptrs = base + rows.to(tl.int64)[:, None] * stride + dims[None, :]
    if MASK_ROWS and MASK_DIMS:
        return tl.load(ptrs, mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    if MASK_ROWS:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    if MASK_DIMS:
        return tl.load(ptrs, mask=(dims < HEAD_DIM)[None, :], other=0.0)
    return tl.load(ptrs)


@triton.jit
def _attend_keys(acc, acc_tail, l_i, m_i, q_block, q_tail, k_base, v_base, tile_start, tile_end, length, scale_log2,
                 stride_kt, stride_vt, MASKED: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 HEAD_MAIN: tl.constexpr, HEAD_TAIL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key tiles [tile_start, tile_end) of one sequence; scores in log2 units. MASKED: the
    tiles may run past the sequence's end. With a tail (HEAD_TAIL > 0), dims HEAD_MAIN.. of every head are a second
    pair of dots: the scores are the sum of both parts' QK^T, P.V fills both accumulators."""
    dims = tl.arange(0, HEAD_MAIN)
    tail_dims = HEAD_MAIN + tl.arange(0, HEAD_TAIL if HEAD_TAIL > 0 else 16)
    for kv_tile in range(tile_start, tile_end):
        keys = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = keys < length
        k_block = _rows(k_base, keys, stride_kt, dims, key_ok, HEAD_DIM, MASKED, HEAD_DIM < HEAD_MAIN)
        v_block = _rows(v_base, keys, stride_vt, dims, key_ok, HEAD_DIM, MASKED, HEAD_DIM < HEAD_MAIN)
        # the interpreter's fp32 upcast: q is fp32, so keys and values follow it
        k_block = k_block.to(q_block.dtype)
        v_block = v_block.to(q_block.dtype)
        scores = tl.dot(q_block, tl.trans(k_block), input_precision=DOT_PRECISION)
        if HEAD_TAIL > 0:
            k_tail = _rows(k_base, keys, stride_kt, tail_dims, key_ok, HEAD_DIM, MASKED, True).to(q_block.dtype)
            scores = tl.dot(q_tail, tl.trans(k_tail), scores, input_precision=DOT_PRECISION)
        scores = scores * scale_log2
        if MASKED:
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(v_block.dtype)
        acc = tl.dot(p, v_block, acc * alpha[:, None], input_precision=DOT_PRECISION)
        if HEAD_TAIL > 0:
            v_tail = _rows(v_base, keys, stride_vt, tail_dims, key_ok, HEAD_DIM, MASKED, True).to(q_block.dtype)
            acc_tail = tl.dot(p, v_tail, acc_tail * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, acc_tail, l_i, m_i


@triton.jit
def _store_rows(out, token, head, stride_ot, stride_oh, dims, row_ok, acc, HEAD_DIM: tl.constexpr):
    ptrs = out + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    tl.store(ptrs, acc.to(out.dtype.element_ty), mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :])


# The pack's sequence count changes from call to call: not specialized on (1, multiples of 16), so a new image count
# is no new compile.
@triton.jit(do_not_specialize=["num_seqs"])
def _encoder_attention_kernel(
        q, k, v, out, cu_seqlens, scale_log2, num_seqs,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_MAIN: tl.constexpr, HEAD_TAIL: tl.constexpr, UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr):
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
    token = start.to(tl.int64) + q_local
    q_base = q + token * stride_qt + head * stride_qh  # [BLOCK_M] row starts
    dims = tl.arange(0, HEAD_MAIN)
    tail_dims = HEAD_MAIN + tl.arange(0, HEAD_TAIL if HEAD_TAIL > 0 else 16)
    q_block = tl.load(q_base[:, None] + dims[None, :], mask=row_ok[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    q_tail = tl.load(q_base[:, None] + tail_dims[None, :], mask=row_ok[:, None] & (tail_dims < HEAD_DIM)[None, :],
                     other=0.0)
    if UPCAST:
        q_block = q_block.to(tl.float32)
        q_tail = q_tail.to(tl.float32)

    # A finite start keeps the masked rows NaN-free: exp2(-inf - (-1e30)) = 0.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_MAIN], dtype=tl.float32)
    acc_tail = tl.zeros([BLOCK_M, HEAD_TAIL if HEAD_TAIL > 0 else 16], dtype=tl.float32)
    k_base = k + start.to(tl.int64) * stride_kt + kv_head * stride_kh
    v_base = v + start.to(tl.int64) * stride_vt + kv_head * stride_vh
    full_tiles = length // BLOCK_N  # every key of these is the sequence's: no key mask
    acc, acc_tail, l_i, m_i = _attend_keys(
        acc, acc_tail, l_i, m_i, q_block, q_tail, k_base, v_base, 0, full_tiles, length, scale_log2, stride_kt,
        stride_vt, False, BLOCK_N, HEAD_DIM, HEAD_MAIN, HEAD_TAIL, DOT_PRECISION)
    acc, acc_tail, l_i, m_i = _attend_keys(
        acc, acc_tail, l_i, m_i, q_block, q_tail, k_base, v_base, full_tiles, tl.cdiv(length, BLOCK_N), length,
        scale_log2, stride_kt, stride_vt, True, BLOCK_N, HEAD_DIM, HEAD_MAIN, HEAD_TAIL, DOT_PRECISION)

    inv_l = 1.0 / tl.where(l_i == 0.0, 1.0, l_i)
    _store_rows(out, token, head, stride_ot, stride_oh, dims, row_ok, acc * inv_l[:, None], HEAD_DIM)
    if HEAD_TAIL > 0:
        _store_rows(out, token, head, stride_ot, stride_oh, tail_dims, row_ok, acc_tail * inv_l[:, None], HEAD_DIM)


def head_split(head_dim: int, split: bool = True) -> tuple[int, int]:
    """(main, tail) widths a head is computed in: a head_dim that is a power of two (at least the 16 a dot takes) is
    one part; otherwise, split, the largest power of two below it and the rest padded to a power of two of at least 16
    (the 31B tower's 72 as 64 + 16: 80 columns of dots against 128 padded whole), else padded whole."""
    whole = max(16, triton.next_power_of_2(head_dim))
    if whole == head_dim or head_dim < 16 or not split:
        return whole, 0
    main = whole // 2
    return main, max(16, triton.next_power_of_2(head_dim - main))


def splits_heads(q: torch.Tensor) -> bool:
    """Whether a head that is no power of two is split (tuning.ENCODER_SPLIT_HEADS): 4-byte values or the
    interpreter always; 2-byte values where the platform's row says so."""
    if q.element_size() > 2 or interpreting():
        return True
    return ENCODER_SPLIT_HEADS.get(platform_of(q.device).kind, False)


def pick_config(q: torch.Tensor, split: bool) -> AttnConfig:
    """Tiles by the head's dot columns (head_split) and platform (tuning.ENCODER_TILES); 4-byte values (fp32, or
    any dtype under the interpreter) take the smaller ones."""
    columns = sum(head_split(q.shape[2], split))
    _, nvidia, rocm, four_byte = next(row for row in ENCODER_TILES if columns >= row[0])
    if q.element_size() > 2 or interpreting():
        return four_byte
    return rocm if platform_of(q.device).kind == "rocm" else nvidia


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedSequences,
                      scale: float, split: bool | None = None) -> torch.Tensor:
    """Same contract as torch_ref.encoder_attention; the sequences' bounds are read on the device (one launch).
    split: a head that is no power of two in two parts (True) or padded whole (False); None: the platform's
    default (splits_heads)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    num_seqs = packed.cu_seqlens.shape[0] - 1
    q, k, v = (t if t.stride(2) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    split = splits_heads(q) if split is None else split
    config = pick_config(q, split)
    block_m = max(config.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    main, tail = head_split(head_dim, split)
    run_kernel(_encoder_attention_kernel, grid,
               q, k, v, out, packed.cu_seqlens, scale * LOG2E, num_seqs,
               q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               out.stride(0), out.stride(1),
               GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=config.block_n, HEAD_DIM=head_dim,
               HEAD_MAIN=main, HEAD_TAIL=tail, UPCAST=interpreting(), DOT_PRECISION=dot_precision(q.dtype),
               num_warps=config.num_warps, num_stages=config.num_stages)
    return out


DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _refuses(platform, shape: dict) -> str | None:
    head_dim = shape.get("head_dim")
    if head_dim is not None and head_dim > ENCODER_MAX_HEAD_DIM:
        return f"head_dim {head_dim} exceeds the encoder kernel's {ENCODER_MAX_HEAD_DIM} (its tiles stop there)"
    if shape.get("gqa", 1) > MAX_GQA_GROUP:
        return f"{shape['gqa']} query heads per KV head exceed {MAX_GQA_GROUP}"
    if shape.get("dtype", torch.bfloat16) not in DTYPES:
        return f"encoder_attention takes bfloat16, float16 or float32, not {shape['dtype']}"
    return None


# a vision tower's packed images, bidirectional; one launch, no sync; a grid by the pack's rows and bound count,
# the bounds read on the device
declare("encoder_attention", "triton", encoder_attention, refuses=_refuses, tuning=tuning,
        capabilities={"graphs_packed_sequences"})
