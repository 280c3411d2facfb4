"""LoRA shrink and expand for a batch whose rows use different adapter slots (punica's BGMV: each row gathers its
own slot's A and B). Same contracts as torch_ref.lora. Decode-sized batches are the case that matters: each program
streams one row's slice of its slot's weights, the shrink's K split over programs until they fill the GPU, and rows
without a slot (-1) load nothing."""
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
def _slice_ranks(at, stride_ss, splits, piece, R, live, BLOCK_R: tl.constexpr):
    """One fused slice's shrunk ranks of the row, its K slices added: fp32 [BLOCK_R]."""
    ranks = tl.arange(0, BLOCK_R)
    mask = (ranks < R) & live
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for split in range(splits):
        acc += tl.load(at + split * stride_ss + piece * R + ranks, mask=mask, other=0.0)
    return acc


# splits changes with the step's rows: specializing on it (1, multiples of 16) would compile mid-serving
@triton.jit(do_not_specialize=["splits"])
def _expand_kernel(y, shrunk, b, slots, N, R, splits, slices, end0, end1, stride_yt, stride_ss, stride_st,
                   stride_bl, stride_bn, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """Program (row, column block): y's columns += the row's shrunk ranks (the sum of its `splits` K slices) times
    its slot's B, each column through its own fused slice's ranks."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slots + row)
    col_mask = (cols < N) & (slot >= 0)
    ranks = tl.arange(0, BLOCK_R)
    mask = col_mask[:, None] & (ranks < R)[None, :]
    piece = ((cols >= end0).to(tl.int32) + (cols >= end1).to(tl.int32))[:, None]  # each column's fused slice
    at = shrunk + row * stride_st
    first = _slice_ranks(at, stride_ss, splits, 0, R, slot >= 0, BLOCK_R)
    second = _slice_ranks(at, stride_ss, splits, 1, R, (slot >= 0) & (slices > 1), BLOCK_R)
    third = _slice_ranks(at, stride_ss, splits, 2, R, (slot >= 0) & (slices > 2), BLOCK_R)
    sv = tl.where(piece == 0, first[None, :], tl.where(piece == 1, second[None, :], third[None, :]))
    bv = tl.load(b + tl.maximum(slot, 0).to(tl.int64) * stride_bl + cols[:, None] * stride_bn + ranks[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(sv * bv, axis=1)
    yv = tl.load(y + row * stride_yt + cols, mask=col_mask, other=0.0).to(tl.float32)
    tl.store(y + row * stride_yt + cols, (yv + delta).to(y.dtype.element_ty), mask=col_mask)


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
    ends = [sum(slice_sizes[:i + 1]) for i in range(len(slice_sizes))][:-1] + [n] * MAX_SLICES
    if rows:
        run_kernel(_expand_kernel, (rows, triton.cdiv(n, tuning.EXPAND_BLOCK_N)), y, parts, b, slots, n, rank,
                   parts.shape[0], len(slice_sizes), ends[0], ends[1], y.stride(0), parts.stride(0), parts.stride(1),
                   b.stride(0), b.stride(1), BLOCK_N=tuning.EXPAND_BLOCK_N, BLOCK_R=triton.next_power_of_2(rank),
                   num_warps=tuning.EXPAND_WARPS)


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("slices", 1) > MAX_SLICES:
        return f"{shape['slices']} fused slices; the kernel serves up to {MAX_SLICES}"
    return None


declare("lora_shrink", "triton", lora_shrink, tuning=tuning)
declare("lora_expand", "triton", lora_expand, refuses=_refuses, tuning=tuning)
