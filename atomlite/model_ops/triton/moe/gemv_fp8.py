"""MXFP4 experts for a handful of (token, slot) pairs on fp8 tensor cores (NVIDIA sm_89+, dynamic MXFP4
activations): moe_gemv's program layout (one pair and block of features per program, straight from topk_ids), with
mxfp4_gemm_fp8's products: each 32-block's dot product is an exact fp8 MMA over e2m1 codes moved into e4m3, scaled
by the two blocks' e8m0 scales in fp32. gate_up writes [gate | up] in fp32, and the quantization of the inner
activations computes gelu_tanh(gate) * up as it reads them. The activations are quantized by mxfp4_gemm_fp8's
kernel into its block-diagonal form at period 8 (row 8r + j holds row r's blocks b with b % 8 == j), so one MMA per
256-K step yields a row's eight block sums. A dot needs 16 columns: the program's one row is taken twice and the two
copies' sums halved at the end (exact). moe_gemv's fp32 multiply-adds expand every code to a float first and ran at
3.7x the bytes' time at one token (bench/moe_layer.py, H100); here that expansion is five bit operations per eight
codes.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.common import (gdc_launch_dependents, gdc_wait, num_sms, pdl_launch, platform_of,
                                              run_kernel)
from atomlite.model_ops.triton.moe.common import ExpertWeights, sum_slots
from atomlite.model_ops.triton.moe.tuning import FP8_GEMV, FP8_GEMV_PROGRAMS_PER_SM, FP8_GEMV_WARPS, Fp8GemvConfig
from atomlite.model_ops.triton.mxfp4.fp8_tiles import (STEP_K, _blockwise_k_order, _dependent_launch, _e8m0_to_float,
                                                      _expand_e4m3, quantize_activations, supported)

PERIOD = 8


def usable(x: torch.Tensor, gate_up: ExpertWeights, quantize_x: bool) -> bool:
    return gate_up.mxfp4 and quantize_x and supported(x)


@triton.jit
def _row_pointers(xq, x_scale, row, stride_xm, stride_sm):
    """One row r of the quantized activations, twice: x' rows 8r + j ([16, 256] per step) and its scales [2, 8]."""
    x_row = tl.reshape(8 * row + tl.arange(0, 8)[None, :] + 0 * tl.arange(0, 2)[:, None], (16,))
    x_rows = xq + x_row[:, None] * stride_xm + tl.arange(0, 256)[None, :]
    xs_rows = x_scale + row * stride_sm + 0 * tl.arange(0, 2)[:, None] + tl.arange(0, 8)[None, :]
    return x_rows, xs_rows


@triton.jit
def _expert_rows(w, w_scale, expert, rn, stride_we, stride_wn, stride_se, stride_sn):
    """Pointers to expert's packed rows rn ([BLOCK_N, 128] bytes per step) and their scale bytes ([BLOCK_N, 8])."""
    w_at = w + expert * stride_we + rn[:, None] * stride_wn + tl.arange(0, 128)[None, :]
    s_at = w_scale + expert * stride_se + rn[:, None] * stride_sn + tl.arange(0, 8)[None, :]
    return w_at, s_at


@triton.jit
def _scaled_block_sums(acc, w_at, w_bytes, x_tile, x_factors, k0, PTX: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc [BLOCK_N, 16] += the step's per-block sums of W's rows with x' (columns (copy, j)), times both scales."""
    low, high = _expand_e4m3(tl.load(w_at + k0 // 2), PTX)
    sums = tl.dot(_blockwise_k_order(low, high, BLOCK_N, 256), tl.trans(x_tile))
    w_factors = _e8m0_to_float(w_bytes.to(tl.int32))
    return acc + sums * tl.reshape(w_factors[:, None, :] * x_factors[None, :, :], (BLOCK_N, 16))


@triton.jit
def _row_total(acc):
    """[BLOCK_N, 16] block sums (two copies of eight) -> [BLOCK_N]: halved for the copies, times 2^6 for the
    e4m3 expansion's 2^-6."""
    return tl.sum(acc, axis=1) * 32.0


@triton.jit
def _gate_up_fp8_kernel(xq, x_scale, w, w_scale, topk_ids, gate_up_out, N, K_SPLIT, K_END, stride_xm, stride_sm,
                        stride_we, stride_wn, stride_se, stride_sn, stride_gm, stride_gs, TOP_K: tl.constexpr,
                        PTX: tl.constexpr, PDL: tl.constexpr, BLOCK_N: tl.constexpr):
    """[gate | up] of pair's token for BLOCK_N of the N = 2I rows over split program_id(2)'s K range, in fp32 (the
    inner quantization sums the splits and applies the activation: gate and up rows in separate programs give
    twice the programs of a gate-with-up tile)."""
    pair = tl.program_id(0)
    expert = tl.load(topk_ids + pair).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_first = tl.program_id(2) * K_SPLIT
    w_at, s_at = _expert_rows(w, w_scale, expert, rn % N, stride_we, stride_wn, stride_se, stride_sn)
    x_rows, xs_rows = _row_pointers(xq, x_scale, pair // TOP_K, stride_xm, stride_sm)
    acc = _streamed_sums(w_at, s_at, x_rows, xs_rows, k_first, tl.minimum(k_first + K_SPLIT, K_END), PTX, PDL,
                         BLOCK_N)
    out = gate_up_out + tl.program_id(2) * stride_gs + pair.to(tl.int64) * stride_gm
    tl.store(out + rn, _row_total(acc), mask=rn < N)


@triton.jit
def _streamed_sums(w_at, s_at, x_rows, xs_rows, k_first, k_end, PTX: tl.constexpr, PDL: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """The scaled block sums [BLOCK_N, 16] of W's rows with x' over [k_first, k_end): the next step's scale bytes
    in flight."""
    w_bytes = tl.load(s_at + k_first // 32)
    if PDL:
        gdc_wait()  # for the quantization kernel launched just before
        gdc_launch_dependents()  # the next kernel's programs may start; they wait for this grid's outputs
    x_factors = tl.load(xs_rows + k_first // 32)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(k_first, k_end, 256):
        k_next = tl.minimum(k0 + 256, k_end - 256)  # the last step re-reads its own scales
        # Kept as bytes until used: converted here, the load's latency would stall this step.
        w_next, x_factors_next = tl.load(s_at + k_next // 32), tl.load(xs_rows + k_next // 32)
        acc = _scaled_block_sums(acc, w_at, w_bytes, tl.load(x_rows + k0), x_factors, k0, PTX, BLOCK_N)
        w_bytes, x_factors = w_next, x_factors_next
    return acc


@triton.jit
def _down_fp8_kernel(xq, x_scale, w, w_scale, topk_ids, topk_weights, pair_out, N, K_END, stride_xm, stride_sm,
                     stride_we, stride_wn, stride_se, stride_sn, stride_op, PTX: tl.constexpr, PDL: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    pair = tl.program_id(0)
    expert = tl.load(topk_ids + pair).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_at, s_at = _expert_rows(w, w_scale, expert, rn % N, stride_we, stride_wn, stride_se, stride_sn)
    x_rows, xs_rows = _row_pointers(xq, x_scale, pair, stride_xm, stride_sm)
    acc = _streamed_sums(w_at, s_at, x_rows, xs_rows, 0, K_END, PTX, PDL, BLOCK_N)
    total = _row_total(acc) * tl.load(topk_weights + pair).to(tl.float32)
    tl.store(pair_out + pair.to(tl.int64) * stride_op + rn, total, mask=rn < N)


def _pdl(x: torch.Tensor) -> dict:
    """A dependent launch on its quantization kernel where there is one (sm_90): the kernel flag and launch option."""
    pdl = _dependent_launch(x)
    return dict(PDL=pdl, **pdl_launch(pdl))


def _gate_up_splits(x: torch.Tensor, num_pairs: int, n: int, k: int, config: Fp8GemvConfig) -> int:
    if config.gate_up_splits is not None:
        return config.gate_up_splits
    programs, splits = num_pairs * triton.cdiv(n, config.gate_up_block_n), 1
    while programs * splits < FP8_GEMV_PROGRAMS_PER_SM * num_sms(x.device) and splits < k // STEP_K:
        splits += 1
    return splits


def gemv_experts_fp8(x: torch.Tensor, gate_up: ExpertWeights, down: ExpertWeights, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, config: Fp8GemvConfig = FP8_GEMV,
                     summed: bool = True) -> torch.Tensor | PartialSums:
    """moe_gemv.gemv_experts for MXFP4 experts with dynamic MXFP4 activations (x and the inner activations are
    quantized as the reference does), on weights padded along K to a multiple of 256 (pad_to_k_align)."""
    tokens, top_k = topk_ids.shape
    num_pairs = tokens * top_k
    if num_pairs == 0:
        return torch.empty_like(x)
    for weights in (gate_up, down):
        if weights.weight.shape[2] * 2 % STEP_K:
            raise ValueError(f"the fp8 expert kernels take weights padded along K to a multiple of {STEP_K}: "
                             "prepare them with mxfp4_gemm.pad_to_k_align")
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    inner_size, hidden = gate_up.weight.shape[1] // 2, down.weight.shape[1]
    ptx = platform_of(x.device).kind == "cuda"
    k_gate_up, k_down = gate_up.weight.shape[2] * 2, down.weight.shape[2] * 2
    xq, x_scale = quantize_activations(x, k_gate_up, PERIOD)
    wanted = _gate_up_splits(x, num_pairs, 2 * inner_size, k_gate_up, config)
    k_split = triton.cdiv(k_gate_up // STEP_K, wanted) * STEP_K
    splits = triton.cdiv(k_gate_up, k_split)
    gate_up_out = torch.empty((splits, num_pairs, 2 * inner_size), dtype=torch.float32, device=x.device)
    run_kernel(_gate_up_fp8_kernel, (num_pairs, triton.cdiv(2 * inner_size, config.gate_up_block_n), splits), xq,
               x_scale, gate_up.weight, gate_up.scale, ids, gate_up_out, 2 * inner_size, k_split, k_gate_up,
               xq.stride(0), x_scale.stride(0), *gate_up.strides(), gate_up_out.stride(1), gate_up_out.stride(0),
               TOP_K=top_k, PTX=ptx, BLOCK_N=config.gate_up_block_n, num_warps=FP8_GEMV_WARPS,
               num_stages=config.num_stages,
               **_pdl(x))
    inner_q, inner_scale = quantize_activations(gate_up_out if splits > 1 else gate_up_out[0], k_down, PERIOD,
                                                gated=True)
    pair_out = torch.empty((num_pairs, hidden), dtype=torch.float32, device=x.device)
    run_kernel(_down_fp8_kernel, (num_pairs, triton.cdiv(hidden, config.down_block_n)), inner_q, inner_scale,
               down.weight, down.scale, ids, weights, pair_out, hidden, k_down, inner_q.stride(0),
               inner_scale.stride(0), *down.strides(), pair_out.stride(0), PTX=ptx, BLOCK_N=config.down_block_n,
               num_warps=FP8_GEMV_WARPS, num_stages=config.num_stages, **_pdl(x))
    return sum_slots(pair_out, tokens, top_k, x.dtype, dependent=_dependent_launch(x), summed=summed)
