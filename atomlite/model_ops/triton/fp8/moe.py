"""FP8 MoE experts as a grouped GEMM (portable Triton): the (token, slot) pairs are sorted by expert on the device
and laid out in blocks of BLOCK_M rows, each block one expert's (padding rows -1), so no count goes to the host
and a graph can capture the step. Activations are quantized before the GEMM (quant.quantize_rows: dynamic scales
once per token; a static scale per pair, each expert's own); each projection is then one launch over (N tiles,
blocks), a block's N tiles launched together so its rows stay in L2 (moe.common.column_first_grid), on gathered fp8
rows and the block's expert's e4m3 weights (gemm.scaled_tile's K loop). 26B-A4B FP8-Dynamic on an H200 (bench
latency, alternating with blocks first): TTFT of 2040 tokens 37.76, 37.81 -> 36.37, 36.90 ms; of 512 tokens 16.17 ->
16.50 ms; batch-1 TPOT 2.48 ms both.

A few pairs (decode at small batch) skip the sort: block b is pair b alone, its expert read from topk_ids. Experts
rarely repeat there, so grouping saves no weight reads; the sort cost a dozen launches per layer. down_proj weights
each pair's row by its routing weight as it stores it (fp32), and moe.common.sum_slots adds a token's rows (or
hands them on unsummed, PartialSums). Quantized experts compute down_proj's input gelu_tanh(gate) * up in its
quantization where that costs no more (quant.quantizes_gated_cheaply). On sm_90 the GEMM is a dependent launch: it
waits for the kernel before, which wrote its rows and may have written the routing (so no weight is read before the
wait)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums, TokenRows
from atomlite.model_ops.triton.activation import gelu_tanh_and_mul
from atomlite.model_ops.triton.common import dependent_launches, gdc_wait, interpreting, pdl_launch, run_kernel
from atomlite.model_ops.triton.fp8.gemm import scale_tile, scaled_tile
from atomlite.model_ops.triton.fp8.quant import quantize_rows, quantizes_gated_cheaply
from atomlite.model_ops.triton.fp8.tuning import PAIR_BLOCKS_MAX_PAIRS, moe_block_m, moe_tile_config
from atomlite.model_ops.triton.moe.common import column_first_grid, sum_slots


@triton.jit
def fp8_moe_gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, rows_ptr, block_expert_ptr, pair_weights_ptr, N, K,
                        num_experts, rows_per_source, stride_xm, stride_xsm, stride_we, stride_wn, stride_wse,
                        stride_wsn, stride_ym, X_SCALED: tl.constexpr, X_BLOCKS: tl.constexpr,
                        W_BLOCKS: tl.constexpr, SCALE_K: tl.constexpr, FP32_DOT: tl.constexpr,
                        PAIR_BLOCKS: tl.constexpr, ROUTED: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """Row r of block b is pair rows[b * BLOCK_M + r] (-1: padding); it reads x row pair // rows_per_source and
    writes y row pair. PAIR_BLOCKS: block b is pair b alone (row 0; the others padding) and block_expert is
    topk_ids. ROUTED: y row pair is multiplied by pair_weights[pair]. PDL: a dependent launch."""
    pid_n, pid_b = tl.program_id(0), tl.program_id(1)  # a block's column tiles launch together (column_first_grid)
    if PDL:
        gdc_wait()
    expert = tl.load(block_expert_ptr + pid_b)
    if expert < num_experts:
        if PAIR_BLOCKS:
            pairs = tl.where(tl.arange(0, BLOCK_M) == 0, pid_b, -1)
        else:
            pairs = tl.load(rows_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
        m_ok = pairs >= 0
        src = tl.where(m_ok, pairs, 0) // rows_per_source
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        xs_rows = xs_ptr + src * stride_xsm
        ws_rows = ws_ptr + expert * stride_wse + rn * stride_wsn
        acc, _ = scaled_tile(x_ptr + src * stride_xm, xs_rows, w_ptr + expert * stride_we + rn * stride_wn, ws_rows, 1,
                             m_ok, n_ok, 0, K, X_BLOCKS, W_BLOCKS, SCALE_K, FP32_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
        acc = scale_tile(acc, xs_rows, ws_rows, m_ok, n_ok, X_SCALED, X_BLOCKS, W_BLOCKS)
        if ROUTED:
            acc = acc * tl.load(pair_weights_ptr + pairs, mask=m_ok, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + tl.where(m_ok, pairs, 0)[None, :] * stride_ym + rn[:, None]  # the tile is transposed
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


def expert_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [blocks * block_m] int32: pair indices sorted by expert, each expert's run padded with -1 to whole
    blocks; block_expert [blocks] int32: each block's expert, num_experts for the unused blocks at the end), sized
    for the worst case so that nothing depends on the counts on the host."""
    flat = topk_ids.flatten().long()
    pairs = flat.numel()
    blocks = triton.cdiv(pairs, block_m) + num_experts
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    starts = counts.cumsum(0) - counts
    expert_of_sorted = flat[order]
    rank = torch.arange(pairs, device=flat.device) - starts[expert_of_sorted]
    position = (padded_ends - padded)[expert_of_sorted] + rank
    rows = torch.full((blocks * block_m,), -1, dtype=torch.int32, device=flat.device)
    rows[position] = order.to(torch.int32)
    block_starts = torch.arange(blocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(padded_ends, block_starts, right=True).to(torch.int32)
    return rows, block_expert


def quantize_pairs(x: "torch.Tensor | TokenRows", pair_experts: torch.Tensor, rows_per_source: int,
                   input_scale: torch.Tensor | None, activation: str | None, fp8_dtype: torch.dtype, group_size: int,
                   gated: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(rows the GEMM reads, their scales, rows_per_source left for it). Dynamic scales are the token's for every
    expert: x is quantized once (or was, per token, by the kernel that wrote it: TokenRows). A static scale is each
    pair's expert's own: one quantized row per pair. gated: x is [gate | up] and gelu_tanh(gate) * up is what is
    quantized."""
    if isinstance(x, TokenRows):
        assert activation == "token" and not gated, "TokenRows are the experts' input quantized per token"
        return x.values, x.scales, rows_per_source
    if activation is None:
        assert not gated, "weight-only experts take gelu_tanh(gate) * up computed"
        return x, None, rows_per_source
    if activation == "static":
        q, scales = quantize_rows(x, "static", fp8_dtype, static_scale=input_scale.float()[pair_experts.long()],
                                  rows_per_source=rows_per_source, gated=gated)
        return q, scales, 1
    q, scales = quantize_rows(x, activation, fp8_dtype, group_size, gated=gated)
    return q, scales, rows_per_source


def fp8_moe_gemm(x: "torch.Tensor | TokenRows", weight: torch.Tensor, scale: torch.Tensor,
                 input_scale: torch.Tensor | None, layout: "PairLayout", rows_per_source: int, activation: str | None,
                 group_size: int, scale_block_k: int, pair_weights: torch.Tensor | None = None,
                 gated: bool = False) -> torch.Tensor:
    """y [pairs, N]: y[pair] = q(x[pair // rows_per_source]) W_e^T for pair's expert e, in x's dtype; with
    pair_weights [pairs], times pair's weight, in fp32. gated: x is [gate | up] (quantize_pairs). x may come
    quantized per token (TokenRows)."""
    num_experts, n, k = weight.shape
    out_rows = layout.pair_experts.numel()
    device = weight.device
    y = torch.empty(out_rows, n, dtype=x.dtype if pair_weights is None else torch.float32, device=device)
    if out_rows == 0:  # every pair's row is written
        return y
    a, a_scale, rows_per_source = quantize_pairs(x, layout.pair_experts, rows_per_source, input_scale, activation,
                                                 weight.dtype, group_size, gated)
    fp32_dot = interpreting() or a.dtype == torch.float32
    config = moe_tile_config(layout.block_m, device, fp32_dot)
    x_blocks = a_scale is not None and a_scale.shape[1] > 1
    w_blocks = scale.shape[-1] > 1
    scale_k = group_size if x_blocks else scale_block_k
    a_scale_arg = a_scale if a_scale is not None else scale
    grid = column_first_grid(layout.block_expert.numel(), triton.cdiv(n, config.block_n))
    pdl = dependent_launches(device)
    run_kernel(fp8_moe_gemm_kernel, grid, a, a_scale_arg, weight, scale, y, layout.rows, layout.block_expert,
               pair_weights if pair_weights is not None else scale, n, k, num_experts, rows_per_source, a.stride(0),
               a_scale_arg.stride(0), weight.stride(0), weight.stride(1), scale.stride(0), scale.stride(1),
               y.stride(0), X_SCALED=a_scale is not None, X_BLOCKS=x_blocks, W_BLOCKS=w_blocks,
               SCALE_K=scale_k or k, FP32_DOT=fp32_dot, PAIR_BLOCKS=layout.rows is None,
               ROUTED=pair_weights is not None, BLOCK_M=layout.block_m, BLOCK_N=config.block_n,
               BLOCK_K=config.block_k, PDL=pdl, num_warps=config.num_warps, num_stages=config.num_stages,
               **pdl_launch(pdl))
    return y


@dataclass(frozen=True)
class PairLayout:
    """How the grouped GEMM's blocks hold the (token, slot) pairs: sorted by expert (rows, block_expert from
    expert_blocks), or one pair per block (rows None, block_expert = topk_ids flattened)."""
    rows: torch.Tensor | None
    block_expert: torch.Tensor
    pair_experts: torch.Tensor  # each pair's expert (static input scales are the expert's own)
    block_m: int

    @classmethod
    def of(cls, topk_ids: torch.Tensor, num_experts: int) -> "PairLayout":
        pairs = topk_ids.flatten()
        block_m = moe_block_m(pairs.numel())
        if pairs.numel() <= PAIR_BLOCKS_MAX_PAIRS:
            return cls(None, pairs, pairs, block_m)
        return cls(*expert_blocks(topk_ids, num_experts, block_m), pairs, block_m)


def fp8_experts(x: "torch.Tensor | TokenRows", gate_up: tuple, down: tuple, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, activation: str | None, group_size: int, scale_block_k: int,
                summed: bool = True) -> torch.Tensor | PartialSums:
    """The experts: gate_up, gelu_tanh(gate) * up, down weighted by each pair's routing weight, and the slots'
    sum per token (summed=False: unsummed, PartialSums). gate_up / down: (weight, scale, input_scale or None). x
    may come quantized per token (TokenRows)."""
    tokens, top_k = topk_ids.shape
    layout = PairLayout.of(topk_ids, gate_up[0].shape[0])
    common = dict(activation=activation, group_size=group_size, scale_block_k=scale_block_k)
    h = fp8_moe_gemm(x, *gate_up, layout, rows_per_source=top_k, **common)
    gated = quantizes_gated_cheaply(h.shape[0], h.shape[1] // 2, activation, h.device)
    pair_out = fp8_moe_gemm(h if gated else gelu_tanh_and_mul(h), *down, layout, rows_per_source=1,
                            pair_weights=topk_weights.flatten(), gated=gated, **common)
    return sum_slots(pair_out, tokens, top_k, x.dtype, summed=summed)
