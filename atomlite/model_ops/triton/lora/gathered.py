"""LoRA shrink and expand for a batch whose rows use different adapter slots (punica's BGMV). Same contracts as
torch_ref.lora. Decode-sized batches are the case that matters: the shrink streams one row's slice of its slot's A
per program, K split over programs until they fill the GPU; the expand takes a tile of rows and visits each slot
once, reading its B tile for all the tile's rows that use it. Rows without a slot (-1) load nothing."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.common import num_sms, run_kernel
from atomlite.model_ops.triton.lora import tuning

MAX_SLICES = 3  # q/k/v


@triton.jit
def _shrink_kernel(x, a, slots, out, K, R, k_per_split, stride_xt, stride_al, stride_ar, stride_os, stride_ot,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (row, rank block, K slice): that slice's share of the row's ranks, into out[slice]."""
    row, split = tl.program_id(0), tl.program_id(2)
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    slot = tl.load(slots + row)
    live = slot >= 0
    weights = a + tl.maximum(slot, 0).to(tl.int64) * stride_al
    rank_mask = (ranks < R) & live
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        col_mask = cols < k_hi
        xv = tl.load(x + row * stride_xt + cols, mask=col_mask & live, other=0.0).to(tl.float32)
        av = tl.load(weights + ranks[:, None] * stride_ar + cols[None, :],
                     mask=rank_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(out + split * stride_os + row * stride_ot + ranks, acc, mask=ranks < R)


@triton.jit
def _slice_of_block(block, blocks1, blocks2, start1, start2, N):
    """The fused slice a column block lies in (each block in one slice), and that slice's first column, its end and
    its first block: blocks1, blocks2 are where slices 1 and 2 begin in blocks, start1, start2 in columns."""
    piece = (block >= blocks1).to(tl.int32) + (block >= blocks2).to(tl.int32)
    first_col = tl.where(piece == 0, 0, tl.where(piece == 1, start1, start2))
    end_col = tl.where(piece == 0, start1, tl.where(piece == 1, start2, N))
    first_block = tl.where(piece == 0, 0, tl.where(piece == 1, blocks1, blocks2))
    return piece, first_col, end_col, first_block


# T and splits change with the step's rows: specializing on them (1, multiples of 16) would compile mid-serving
@triton.jit(do_not_specialize=["T", "splits"])
def _expand_kernel(y, shrunk, b, slots, T, N, R, splits, num_slots, blocks1, blocks2, start1, start2, stride_yt,
                   stride_ss, stride_st, stride_bl, stride_bn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_R: tl.constexpr):
    """Program (row block, column block): y[rows, cols] += each row's shrunk ranks of the block's fused slice (the
    sum of its `splits` K slices) times its slot's B. Each slot is visited once: its B tile is read once for all
    the block's rows that use it, instead of once per row."""
    piece, first_col, end_col, first_block = _slice_of_block(tl.program_id(1), blocks1, blocks2, start1, start2, N)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = first_col + (tl.program_id(1) - first_block) * BLOCK_N + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, BLOCK_R)
    row_slots = tl.load(slots + rows, mask=rows < T, other=-1)
    live, col_mask, rank_mask = row_slots >= 0, cols < end_col, ranks < R
    at = shrunk + rows[:, None] * stride_st + piece * R + ranks[None, :]
    ranks_of_rows = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for split in range(splits):
        ranks_of_rows += tl.load(at + split * stride_ss, mask=live[:, None] & rank_mask[None, :], other=0.0)
    delta = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for slot in range(num_slots):
        mine = row_slots == slot
        if tl.sum(mine.to(tl.int32)) > 0:
            bv = tl.load(b + slot * stride_bl + cols[:, None] * stride_bn + ranks[None, :],
                         mask=col_mask[:, None] & rank_mask[None, :], other=0.0).to(tl.float32)
            own = tl.where(mine[:, None], ranks_of_rows, 0.0)
            delta += tl.sum(own[:, None, :] * bv[None, :, :], axis=2)
    mask = live[:, None] & col_mask[None, :]
    out = y + rows[:, None] * stride_yt + cols[None, :]
    yv = tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, (yv + delta).to(y.dtype.element_ty), mask=mask)


def num_splits(programs: int, k: int, device: torch.device) -> int:
    """K slices that bring the shrink's programs up to tuning.SHRINK_PROGRAMS_PER_SM per multiprocessor, each
    slice at least tuning.SHRINK_MIN_K_STEPS steps of BLOCK_K wide: a decode batch has few rows, and one program
    walking a row's whole K (21504 on Gemma-4-31B's down_proj) alone would take the kernel's whole time."""
    wanted = triton.cdiv(tuning.SHRINK_PROGRAMS_PER_SM * num_sms(device), max(programs, 1))
    most = max(1, k // (tuning.SHRINK_MIN_K_STEPS * tuning.SHRINK_BLOCK_K))
    return max(1, min(wanted, most))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor | PartialSums:
    """torch_ref.lora_shrink's contract; K split over programs comes back as PartialSums (fp32 [splits, T, R']),
    which lora_expand adds as it reads them."""
    rows, (_, ranks, k) = x.shape[0], a.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_r = min(tuning.SHRINK_BLOCK_R, triton.next_power_of_2(ranks))
    blocks = triton.cdiv(ranks, block_r)
    splits = num_splits(rows * blocks, k, x.device)
    k_per_split = triton.cdiv(triton.cdiv(k, splits), tuning.SHRINK_BLOCK_K) * tuning.SHRINK_BLOCK_K
    splits = triton.cdiv(k, k_per_split)
    out = torch.empty(splits, rows, ranks, dtype=torch.float32, device=x.device)
    if rows:
        run_kernel(_shrink_kernel, (rows, blocks, splits), x, a, slots, out, k, ranks, k_per_split, x.stride(0),
                   a.stride(0), a.stride(1), out.stride(0), out.stride(1), BLOCK_R=block_r,
                   BLOCK_K=tuning.SHRINK_BLOCK_K, num_warps=tuning.SHRINK_WARPS)
    return out[0] if splits == 1 else PartialSums(out, torch.float32)


def lora_expand(y: torch.Tensor, shrunk: torch.Tensor | PartialSums, b: torch.Tensor, slots: torch.Tensor,
                slice_sizes: tuple[int, ...]) -> None:
    rows, n, rank = y.shape[0], y.shape[1], b.shape[2]
    parts = shrunk.parts if isinstance(shrunk, PartialSums) else shrunk[None]
    sizes = list(slice_sizes) + [0] * (MAX_SLICES - len(slice_sizes))
    blocks = [triton.cdiv(size, tuning.EXPAND_BLOCK_N) for size in sizes]
    if rows:
        run_kernel(_expand_kernel, (triton.cdiv(rows, tuning.EXPAND_BLOCK_M), sum(blocks)), y, parts, b, slots, rows,
                   n, rank, parts.shape[0], b.shape[0], blocks[0], blocks[0] + blocks[1], sizes[0], sizes[0] + sizes[1],
                   y.stride(0), parts.stride(0), parts.stride(1), b.stride(0), b.stride(1),
                   BLOCK_M=tuning.EXPAND_BLOCK_M, BLOCK_N=tuning.EXPAND_BLOCK_N, BLOCK_R=triton.next_power_of_2(rank),
                   num_warps=tuning.EXPAND_WARPS)


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("slices", 1) > MAX_SLICES:
        return f"{shape['slices']} fused slices; the kernel serves up to {MAX_SLICES}"
    return None


declare("lora_shrink", "triton", lora_shrink, tuning=tuning)
declare("lora_expand", "triton", lora_expand, refuses=_refuses, tuning=tuning)
