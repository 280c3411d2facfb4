"""FP8 MoE experts as a grouped GEMM (portable Triton): the (token, slot) pairs are sorted by expert on the device
and laid out in blocks of BLOCK_M rows, each block one expert's (padding rows -1), so no count goes to the host
and a graph can capture the step. Activations are quantized before the GEMM (quant.quantize_rows: dynamic scales
once per token; a static scale per pair, each expert's own); each projection is then one launch over (blocks,
N tiles) on gathered fp8 rows and the block's expert's e4m3 weights (gemm.scaled_tile's K loop)."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting, run_kernel
from atomlite.model_ops.triton.fp8.gemm import scale_tile, scaled_tile
from atomlite.model_ops.triton.fp8.quant import quantize_rows
from atomlite.model_ops.triton.fp8.tuning import moe_tile_config


@triton.jit
def fp8_moe_gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, rows_ptr, block_expert_ptr, N, K, num_experts,
                        rows_per_source, stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn,
                        stride_ym, X_SCALED: tl.constexpr, X_BLOCKS: tl.constexpr, W_BLOCKS: tl.constexpr,
                        SCALE_K: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """Row r of block b is pair rows[b * BLOCK_M + r] (-1: padding); it reads x row pair // rows_per_source and
    writes y row pair."""
    pid_b, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_b)
    if expert < num_experts:
        pairs = tl.load(rows_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
        m_ok = pairs >= 0
        src = tl.where(m_ok, pairs, 0) // rows_per_source
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        xs_rows = xs_ptr + src * stride_xsm
        ws_rows = ws_ptr + expert * stride_wse + rn * stride_wsn
        acc = scaled_tile(x_ptr + src * stride_xm, xs_rows, w_ptr + expert * stride_we + rn * stride_wn, ws_rows,
                          m_ok, n_ok, 0, K, X_BLOCKS, W_BLOCKS, SCALE_K, FP32_DOT, BLOCK_M, BLOCK_N, BLOCK_K)
        acc = scale_tile(acc, xs_rows, ws_rows, m_ok, n_ok, X_SCALED, X_BLOCKS, W_BLOCKS)
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


def quantize_pairs(x: torch.Tensor, pair_experts: torch.Tensor, rows_per_source: int, input_scale: torch.Tensor | None,
                   activation: str | None, fp8_dtype: torch.dtype, group_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(rows the GEMM reads, their scales, rows_per_source left for it). Dynamic scales are the token's for every
    expert: x is quantized once. A static scale is each pair's expert's own: one quantized row per pair."""
    if activation is None:
        return x, None, rows_per_source
    if activation == "static":
        q, scales = quantize_rows(x, "static", fp8_dtype, static_scale=input_scale.float()[pair_experts.long()],
                                  rows_per_source=rows_per_source)
        return q, scales, 1
    q, scales = quantize_rows(x, activation, fp8_dtype, group_size)
    return q, scales, rows_per_source


def fp8_moe_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
                 rows: torch.Tensor, block_expert: torch.Tensor, pair_experts: torch.Tensor, out_rows: int,
                 rows_per_source: int, activation: str | None, group_size: int, scale_block_k: int,
                 block_m: int) -> torch.Tensor:
    """y [out_rows, N]: y[pair] = q(x[pair // rows_per_source]) W_e^T for the expert e of pair's block;
    pair_experts [out_rows]: each pair's expert (for static input scales)."""
    num_experts, n, k = weight.shape
    y = torch.empty(out_rows, n, dtype=x.dtype, device=x.device)  # every pair's row is written
    if out_rows == 0:
        return y
    a, a_scale, rows_per_source = quantize_pairs(x, pair_experts, rows_per_source, input_scale, activation,
                                                 weight.dtype, group_size)
    fp32_dot = interpreting() or a.dtype == torch.float32
    config = moe_tile_config(block_m, x.device, fp32_dot)
    x_blocks = a_scale is not None and a_scale.shape[1] > 1
    w_blocks = scale.shape[-1] > 1
    scale_k = group_size if x_blocks else scale_block_k
    a_scale_arg = a_scale if a_scale is not None else scale
    grid = (block_expert.numel(), triton.cdiv(n, config.block_n))
    run_kernel(fp8_moe_gemm_kernel, grid, a, a_scale_arg, weight, scale, y, rows, block_expert, n, k, num_experts,
               rows_per_source, a.stride(0), a_scale_arg.stride(0), weight.stride(0), weight.stride(1),
               scale.stride(0), scale.stride(1), y.stride(0), X_SCALED=a_scale is not None, X_BLOCKS=x_blocks,
               W_BLOCKS=w_blocks, SCALE_K=scale_k or k, FP32_DOT=fp32_dot, BLOCK_M=block_m,
               BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
               num_stages=config.num_stages)
    return y
