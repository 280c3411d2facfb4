"""Routed experts with bf16/fp16 weights for a few (token, slot) pairs, as skinny GEMMs: a program per pair and
block of BLOCK_N features streams that block of its pair's expert over K in tensor-core tiles, in a software-
pipelined loop (the dense skinny GEMM's form: its loads keep several tiles in flight, where moe_gemv's multiply-adds
keep one). The pair's token row fills row 0 of a 16-row tile; the other rows are masked out.

gate_up writes each pair's [gate | up] in fp32; down computes gelu_tanh(gate) * up as it reads them, rounded to the
weights' dtype for the tensor cores, and writes the pair's row times its routing weight, for the slot sum (or a
norm kernel reading PartialSums) to add in slot order. MXFP4 experts, fp32 weights and shapes off the tiles stay
with moe_gemv.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.partial_sums import PartialSums
from atomlite.model_ops.triton.activation import gelu_tanh
from atomlite.model_ops.triton.common import interpreting, platform_of, run_kernel
from atomlite.model_ops.triton.moe_common import ExpertWeights, sum_slots
from atomlite.model_ops.triton.skinny_gemm import split_k_tile

BLOCK_M = 16  # the smallest tensor-core tile; one pair's row in it


@dataclass(frozen=True)
class SkinnyTiles:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class SkinnyExpertsConfig:
    gate_up: SkinnyTiles
    down: SkinnyTiles


# The dense skinny GEMM's tiles; down's K (the expert intermediate, 704 on Gemma-4-26B-A4B) is a multiple of 64
DEFAULT = SkinnyExpertsConfig(SkinnyTiles(64, 128, 4, 4), SkinnyTiles(64, 64, 4, 4))


def fits(x: torch.Tensor, gate_up: ExpertWeights, down: ExpertWeights,
         config: SkinnyExpertsConfig = DEFAULT) -> bool:
    """Whether these experts run here. ROCm keeps moe_gemv (as it keeps hipBLASLt for the dense skinny GEMM's
    shapes) until these tiles are measured there; they compile for gfx942 and gfx950."""
    hidden, inner = x.shape[1], down.weight.shape[2]
    return (platform_of(x.device).kind != "rocm" and not gate_up.mxfp4 and not down.mxfp4 and x.dtype in (torch.bfloat16, torch.float16)
            and gate_up.weight.dtype == down.weight.dtype == x.dtype
            and gate_up.weight.stride(2) == 1 and down.weight.stride(2) == 1
            and hidden % config.gate_up.block_k == 0 and 2 * inner % config.gate_up.block_n == 0
            and inner % config.down.block_k == 0 and hidden % config.down.block_n == 0)


@triton.jit
def _gate_up_kernel(x, w, topk_ids, out, K, stride_xt, stride_we, stride_wn, stride_op, TOP_K: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    pair = tl.program_id(2)  # axes 0 and 1 are split_k_tile's: the block of features, the K slice (one)
    expert = tl.load(topk_ids + pair).to(tl.int64)
    token_row = x + (pair // TOP_K).to(tl.int64) * stride_xt
    acc, rows_m, rows_n = split_k_tile(token_row, w + expert * stride_we, 1, K, K, 0, stride_wn, BLOCK_M, BLOCK_N,
                                       BLOCK_K, UPCAST, False)
    dest = out + pair.to(tl.int64) * stride_op + rows_n[None, :] + rows_m[:, None] * 0
    tl.store(dest, acc, mask=rows_m[:, None] < 1)


@triton.jit
def _down_kernel(gate_up, w, topk_ids, topk_weights, out, INNER, stride_gp, stride_we, stride_wn, stride_op,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    pair = tl.program_id(1)
    expert = tl.load(topk_ids + pair).to(tl.int64)
    rows_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.arange(0, BLOCK_M)
    first = rows_m[:, None] < 1
    w_rows = w + expert * stride_we + rows_n[:, None] * stride_wn
    gate_row = gate_up + pair.to(tl.int64) * stride_gp + rows_m[:, None] * 0
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, INNER, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)[None, :]
        w_tile = tl.load(w_rows + cols)
        gate = tl.load(gate_row + cols, mask=first, other=0.0)
        up = tl.load(gate_row + INNER + cols, mask=first, other=0.0)
        h = (gelu_tanh(gate) * up).to(w_tile.dtype)
        if UPCAST:
            h = h.to(tl.float32)
            w_tile = w_tile.to(tl.float32)
        acc = tl.dot(h, tl.trans(w_tile), acc)
    routed = acc * tl.load(topk_weights + pair).to(tl.float32)
    tl.store(out + pair.to(tl.int64) * stride_op + rows_n[None, :] + rows_m[:, None] * 0, routed, mask=first)


def skinny_experts(x: torch.Tensor, gate_up: ExpertWeights, down: ExpertWeights, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, config: SkinnyExpertsConfig = DEFAULT,
                   summed: bool = True) -> torch.Tensor | PartialSums:
    """moe_gemv.gemv_experts for bf16/fp16 experts (fits() must hold). summed=False: the slots unsummed."""
    tokens, top_k = topk_ids.shape
    num_pairs = tokens * top_k
    if num_pairs == 0:
        return torch.empty_like(x)
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    inner_size, hidden = down.weight.shape[2], down.weight.shape[1]
    gate_up_rows = torch.empty((num_pairs, 2 * inner_size), dtype=torch.float32, device=x.device)
    t = config.gate_up
    run_kernel(_gate_up_kernel, (2 * inner_size // t.block_n, 1, num_pairs), x, gate_up.weight, ids, gate_up_rows,
               hidden, x.stride(0), gate_up.weight.stride(0), gate_up.weight.stride(1), gate_up_rows.stride(0),
               TOP_K=top_k, BLOCK_M=BLOCK_M, BLOCK_N=t.block_n, BLOCK_K=t.block_k, UPCAST=interpreting(),
               num_warps=t.num_warps, num_stages=t.num_stages)
    pair_out = torch.empty((num_pairs, hidden), dtype=torch.float32, device=x.device)
    t = config.down
    run_kernel(_down_kernel, (hidden // t.block_n, num_pairs), gate_up_rows, down.weight, ids, weights, pair_out,
               inner_size, gate_up_rows.stride(0), down.weight.stride(0), down.weight.stride(1), pair_out.stride(0),
               BLOCK_M=BLOCK_M, BLOCK_N=t.block_n, BLOCK_K=t.block_k, UPCAST=interpreting(),
               num_warps=t.num_warps, num_stages=t.num_stages)
    return sum_slots(pair_out, tokens, top_k, x.dtype, summed=summed)
