"""FP8 MoE experts as a grouped GEMM (portable Triton): the (token, slot) pairs are sorted by expert on the device
and laid out in blocks of BLOCK_M rows, each block one expert's (padding rows -1), so no count goes to the host
and a graph can capture the step. Each projection is one launch over (blocks, N tiles): gathered rows, the
checkpoint's activation quantization fused in (gemm.fp8_gemm's), the block's expert's e4m3 weights and scales."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting, run_kernel
from atomlite.model_ops.triton.fp8.gemm import ACT_CODES, _quantize, block_sizes


@triton.jit
def fp8_moe_gemm_kernel(x_ptr, w_ptr, ws_ptr, in_scale_ptr, y_ptr, rows_ptr, block_expert_ptr, N, K, num_experts,
                        rows_per_source, stride_xm, stride_we, stride_wn, stride_wse, stride_wsn, stride_ym,
                        ACT: tl.constexpr, BLOCK_SCALED: tl.constexpr, SCALE_BLOCK_K: tl.constexpr,
                        FNUZ: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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
        rk = tl.arange(0, BLOCK_K)
        n_ok = rn < N
        x_rows = x_ptr + src[:, None] * stride_xm
        w_rows = w_ptr + expert * stride_we + rn[None, :] * stride_wn
        ws_row = ws_ptr + expert * stride_wse + rn * stride_wsn
        x_factor = 2.0 if FNUZ else 1.0

        row_scale = tl.full((BLOCK_M,), 1.0, tl.float32)
        if ACT == 1:
            row_scale = row_scale * tl.load(in_scale_ptr + expert).to(tl.float32)
        if ACT == 2:
            amax = tl.zeros((BLOCK_M,), tl.float32)
            for k in range(0, K, BLOCK_K):
                kk = k + rk
                x = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk[None, :] < K), other=0.0)
                amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
            row_scale = tl.where(amax == 0.0, 1.1920928955078125e-07, amax / 448.0)

        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + rk
            k_ok = kk < K
            x = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            if ACT == 0:
                if FP32_DOT:
                    part = tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
                else:
                    part = tl.dot(x, w.to(x.dtype))
            else:
                xf = x.to(tl.float32)
                if ACT == 3:
                    group_scale = tl.max(tl.abs(xf), axis=1) / 448.0
                    group_scale = tl.where(group_scale == 0.0, 1.1920928955078125e-07, group_scale)
                    part = tl.dot(_quantize(xf, group_scale[:, None], FNUZ, w_ptr.dtype.element_ty), w)
                    part = part * (group_scale * x_factor)[:, None]
                else:
                    part = tl.dot(_quantize(xf, row_scale[:, None], FNUZ, w_ptr.dtype.element_ty), w)
            if BLOCK_SCALED:
                part = part * tl.load(ws_row + k // SCALE_BLOCK_K, mask=n_ok, other=0.0)[None, :]
            acc += part

        if not BLOCK_SCALED:
            acc = acc * tl.load(ws_row, mask=n_ok, other=0.0)[None, :]
        if ACT == 1 or ACT == 2:
            acc = acc * (row_scale * x_factor)[:, None]
        out = y_ptr + tl.where(m_ok, pairs, 0)[:, None] * stride_ym + rn[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


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


def fp8_moe_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
                 rows: torch.Tensor, block_expert: torch.Tensor, out_rows: int, rows_per_source: int,
                 activation: str | None, group_size: int, scale_block_k: int, block_m: int) -> torch.Tensor:
    """y [out_rows, N]: y[pair] = q(x[pair // rows_per_source]) W_e^T for the expert e of pair's block."""
    num_experts, n, k = weight.shape
    y = torch.empty(out_rows, n, dtype=x.dtype, device=x.device)  # every pair's row is written
    _, block_n, block_k = block_sizes(block_m, activation, group_size, scale_block_k)
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    run_kernel(fp8_moe_gemm_kernel, grid, x, weight, scale, input_scale if input_scale is not None else scale, y,
               rows, block_expert, n, k, num_experts, rows_per_source, x.stride(0), weight.stride(0),
               weight.stride(1), scale.stride(0), scale.stride(1), y.stride(0),
               ACT=ACT_CODES[activation], BLOCK_SCALED=scale.shape[-1] > 1, SCALE_BLOCK_K=scale_block_k or k,
               FNUZ=weight.dtype == torch.float8_e4m3fnuz, FP32_DOT=interpreting() or x.dtype == torch.float32,
               BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return y
