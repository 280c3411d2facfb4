"""LoRA shrink and expand for a batch whose rows use different adapter slots (punica's BGMV: each row gathers its
own slot's A and B). Same contracts as torch_ref.lora. Decode-sized batches are the case that matters: each program
streams one row's slice of its slot's weights, and rows without a slot (-1) load nothing."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.common import run_kernel
from atomlite.model_ops.triton.lora import tuning

MAX_SLICES = 3  # q/k/v


@triton.jit
def _shrink_kernel(x, a, slots, out, K, R, stride_xt, stride_al, stride_ar, stride_ot,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    slot = tl.load(slots + row)
    live = slot >= 0
    weights = a + tl.maximum(slot, 0).to(tl.int64) * stride_al
    rank_mask = (ranks < R) & live
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        xv = tl.load(x + row * stride_xt + cols, mask=col_mask & live, other=0.0).to(tl.float32)
        av = tl.load(weights + ranks[:, None] * stride_ar + cols[None, :],
                     mask=rank_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(out + row * stride_ot + ranks, acc, mask=ranks < R)


@triton.jit
def _expand_kernel(y, shrunk, b, slots, N, R, end0, end1, stride_yt, stride_st, stride_bl, stride_bn,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(slots + row)
    col_mask = (cols < N) & (slot >= 0)
    ranks = tl.arange(0, BLOCK_R)
    mask = col_mask[:, None] & (ranks < R)[None, :]
    piece = (cols >= end0).to(tl.int32) + (cols >= end1).to(tl.int32)  # the fused slice each column is in
    sv = tl.load(shrunk + row * stride_st + piece[:, None] * R + ranks[None, :], mask=mask, other=0.0)
    bv = tl.load(b + tl.maximum(slot, 0).to(tl.int64) * stride_bl + cols[:, None] * stride_bn + ranks[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(sv * bv, axis=1)
    yv = tl.load(y + row * stride_yt + cols, mask=col_mask, other=0.0).to(tl.float32)
    tl.store(y + row * stride_yt + cols, (yv + delta).to(y.dtype.element_ty), mask=col_mask)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    rows, (_, ranks, k) = x.shape[0], a.shape
    out = torch.empty(rows, ranks, dtype=torch.float32, device=x.device)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if rows:
        block_r = min(tuning.SHRINK_BLOCK_R, triton.next_power_of_2(ranks))
        run_kernel(_shrink_kernel, (rows, triton.cdiv(ranks, block_r)), x, a, slots, out, k, ranks, x.stride(0),
                   a.stride(0), a.stride(1), out.stride(0), BLOCK_R=block_r, BLOCK_K=tuning.SHRINK_BLOCK_K,
                   num_warps=tuning.SHRINK_WARPS)
    return out


def lora_expand(y: torch.Tensor, shrunk: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
                slice_sizes: tuple[int, ...]) -> None:
    rows, n, rank = y.shape[0], y.shape[1], b.shape[2]
    ends = [sum(slice_sizes[:i + 1]) for i in range(len(slice_sizes))][:-1] + [n] * MAX_SLICES
    if rows:
        run_kernel(_expand_kernel, (rows, triton.cdiv(n, tuning.EXPAND_BLOCK_N)), y, shrunk, b, slots, n, rank,
                   ends[0], ends[1], y.stride(0), shrunk.stride(0), b.stride(0), b.stride(1),
                   BLOCK_N=tuning.EXPAND_BLOCK_N, BLOCK_R=triton.next_power_of_2(rank), num_warps=tuning.EXPAND_WARPS)


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("slices", 1) > MAX_SLICES:
        return f"{shape['slices']} fused slices; the kernel serves up to {MAX_SLICES}"
    return None


declare("lora_shrink", "triton", lora_shrink, tuning=tuning)
declare("lora_expand", "triton", lora_expand, refuses=_refuses, tuning=tuning)
