"""Fused MoE experts for a handful of (token, slot) pairs (decode at small batch): no routing step.

With few pairs the experts rarely repeat, so grouping pairs by expert saves no weight reads; it costs a launch that
sorts, and tiles of block_m rows that hold one pair each. Here a program takes one pair and a block of output
features straight from topk_ids: gate_up reads the pair's token row and writes gelu_tanh(gate) * up in fp32; down
reads that row and weights its result by the pair's routing weight (with dynamic MXFP4 activations each kernel
quantizes the row it reads, per 32-column block, in registers); the slot sum (moe_common) adds each token's rows in
slot order (deterministic). Products are fp32 multiply-adds over [BLOCK_N, BLOCK_K] tiles (one row is no matrix
product), and the next weight tile is loaded while this one is used.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.activation import gelu_tanh
from atomlite.model_ops.triton.common import interpreting, run_kernel
from atomlite.model_ops.triton.moe.common import ExpertWeights, quantize_dequantize_rows, sum_slots, weight_pointers
from atomlite.model_ops.triton.moe.tuning import (GEMV_BF16, GEMV_MAX_PAIRS, GEMV_MXFP4, GEMV_ONE_TILE_DOWN,
                                                  INTERPRETER_GEMV_MAX_BLOCK_N, GemvConfig, GemvTiles)
from atomlite.model_ops.triton.mxfp4.gemm import K_ALIGN, _expand_tile, _expansion_mode
from atomlite.quant import mxfp4


def use_gemv(num_pairs: int) -> bool:
    return num_pairs <= GEMV_MAX_PAIRS


@triton.jit
def _weight_tile(w_ptrs, s_ptrs, k0, K, MXFP4: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Raw weight tile at columns k0..: (packed bytes, scale bytes) for MXFP4 (padded along K: no mask), else
    (values, values)."""
    if MXFP4:
        packed = tl.load(w_ptrs + k0 // 2)
        scale_byte = tl.load(s_ptrs + k0 // 32)
    elif EVEN_K:
        packed = tl.load(w_ptrs + k0)
        scale_byte = packed
    else:
        packed = tl.load(w_ptrs + k0, mask=(k0 + tl.arange(0, BLOCK_K) < K)[None, :], other=0.0)
        scale_byte = packed
    return packed, scale_byte


@triton.jit
def _values(packed, scale_byte, MXFP4: tl.constexpr, FP32: tl.constexpr, WIDE_SCALES: tl.constexpr,
            PTX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # one return: Triton unifies the types of every return, constexpr branches included
    if MXFP4:
        values = _expand_tile(packed, scale_byte, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K)
    else:
        values = packed
    return values.to(tl.float32)


@triton.jit
def _row_tile(row, k0, K, QUANTIZE: tl.constexpr, BLOCK_K: tl.constexpr):
    """One activation row's columns k0.. in fp32 (zeros past K), MXFP4 quantize-dequantized per 32 if QUANTIZE."""
    cols = k0 + tl.arange(0, BLOCK_K)
    values = tl.load(row + cols, mask=cols < K, other=0.0).to(tl.float32)
    if QUANTIZE:
        values = tl.reshape(quantize_dequantize_rows(tl.reshape(values, (1, BLOCK_K)), 1, BLOCK_K), (BLOCK_K,))
    return values


@triton.jit
def _gate_up_gemv_kernel(x, w, w_scale, topk_ids, inner_out, K, INNER, stride_xt, stride_we, stride_wn, stride_se,
                         stride_sn, stride_ir, TOP_K: tl.constexpr, MXFP4: tl.constexpr, QUANTIZE_X: tl.constexpr,
                         FP32: tl.constexpr, WIDE_SCALES: tl.constexpr,
                         PTX: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0)
    expert = tl.load(topk_ids + pair)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_safe = rn % INNER  # rows past INNER re-read valid ones: no load mask; they are not stored
    gate_w, gate_s = weight_pointers(w, w_scale, expert, rn_safe, stride_we, stride_wn, stride_se, stride_sn,
                                      MXFP4, BLOCK_K)
    up_w, up_s = weight_pointers(w, w_scale, expert, rn_safe + INNER, stride_we, stride_wn, stride_se, stride_sn,
                                  MXFP4, BLOCK_K)
    x_row = x + (pair // TOP_K).to(tl.int64) * stride_xt
    acc_gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    gate, gate_scale = _weight_tile(gate_w, gate_s, 0, K, MXFP4, EVEN_K, BLOCK_K)
    up, up_scale = _weight_tile(up_w, up_s, 0, K, MXFP4, EVEN_K, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        k_next = tl.minimum(k0 + BLOCK_K, tl.cdiv(K, BLOCK_K) * BLOCK_K - BLOCK_K)  # the last re-reads its own
        gate_next, gate_scale_next = _weight_tile(gate_w, gate_s, k_next, K, MXFP4, EVEN_K, BLOCK_K)
        up_next, up_scale_next = _weight_tile(up_w, up_s, k_next, K, MXFP4, EVEN_K, BLOCK_K)
        x_tile = _row_tile(x_row, k0, K, QUANTIZE_X, BLOCK_K)[None, :]
        acc_gate += _values(gate, gate_scale, MXFP4, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K) * x_tile
        acc_up += _values(up, up_scale, MXFP4, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K) * x_tile
        gate, gate_scale, up, up_scale = gate_next, gate_scale_next, up_next, up_scale_next
    h = gelu_tanh(tl.sum(acc_gate, axis=1)) * tl.sum(acc_up, axis=1)
    tl.store(inner_out + pair.to(tl.int64) * stride_ir + rn, h, mask=rn < INNER)


@triton.jit
def _down_gemv_kernel(inner, w, w_scale, topk_ids, topk_weights, pair_out, K, N, stride_ir, stride_we, stride_wn,
                      stride_se, stride_sn, stride_op, MXFP4: tl.constexpr, QUANTIZE_IN: tl.constexpr,
                      FP32: tl.constexpr,
                      WIDE_SCALES: tl.constexpr, PTX: tl.constexpr, EVEN_K: tl.constexpr, ONE_TILE: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0)
    expert = tl.load(topk_ids + pair)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_ptrs, s_ptrs = weight_pointers(w, w_scale, expert, rn % N, stride_we, stride_wn, stride_se, stride_sn,
                                      MXFP4, BLOCK_K)
    in_row = inner + pair.to(tl.int64) * stride_ir
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    tile, tile_scale = _weight_tile(w_ptrs, s_ptrs, 0, K, MXFP4, EVEN_K, BLOCK_K)
    if ONE_TILE:  # K fits one tile (EVEN_K or masked): nothing to load ahead
        acc += (_values(tile, tile_scale, MXFP4, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K)
                * _row_tile(in_row, 0, K, QUANTIZE_IN, BLOCK_K)[None, :])
    else:
        for k0 in range(0, K, BLOCK_K):
            k_next = tl.minimum(k0 + BLOCK_K, tl.cdiv(K, BLOCK_K) * BLOCK_K - BLOCK_K)
            tile_next, scale_next = _weight_tile(w_ptrs, s_ptrs, k_next, K, MXFP4, EVEN_K, BLOCK_K)
            acc += (_values(tile, tile_scale, MXFP4, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K)
                    * _row_tile(in_row, k0, K, QUANTIZE_IN, BLOCK_K)[None, :])
            tile, tile_scale = tile_next, scale_next
    total = tl.sum(acc, axis=1) * tl.load(topk_weights + pair).to(tl.float32)
    tl.store(pair_out + pair.to(tl.int64) * stride_op + rn, total, mask=rn < N)


def bf16_config(inner_size: int) -> GemvConfig:
    """The few-pairs tiles for float (not MXFP4) experts of this inner size."""
    if inner_size <= GEMV_ONE_TILE_DOWN.block_k:
        return GemvConfig(GEMV_BF16.gate_up, GEMV_ONE_TILE_DOWN)
    return GEMV_BF16


def default_config(gate_up: ExpertWeights, down: ExpertWeights) -> GemvConfig:
    """The tiles gemv_experts takes unless told. Under TRITON_INTERPRET=1 a program costs Python time per operation,
    so a pair's outputs go to one program where they fit (the column block does not change a sum)."""
    inner, hidden = gate_up.weight.shape[1] // 2, down.weight.shape[1]
    config = GEMV_MXFP4 if gate_up.mxfp4 else bf16_config(inner)
    if not interpreting():
        return config
    return GemvConfig(_all_columns(config.gate_up, inner), _all_columns(config.down, hidden))


def _all_columns(tiles: GemvTiles, n: int) -> GemvTiles:
    return GemvTiles(min(INTERPRETER_GEMV_MAX_BLOCK_N, triton.next_power_of_2(n)), tiles.block_k, tiles.num_warps)


def _modes(x: torch.Tensor, weights: ExpertWeights) -> dict:
    """The weights' expansion flags, as mxfp4_gemm picks them (PTX only means something for MXFP4 weights)."""
    fp32, ptx = _expansion_mode(x, weights.wide_scales)
    return dict(MXFP4=weights.mxfp4, FP32=fp32, WIDE_SCALES=weights.wide_scales, PTX=ptx and weights.mxfp4)


def gemv_experts(x: torch.Tensor, gate_up: ExpertWeights, down: ExpertWeights, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, quantize_x: bool, config: GemvConfig | None = None,
                 summed: bool = True) -> torch.Tensor | PartialSums:
    """moe_gemm.fused_experts for few pairs; quantize_x: x and the inner activations are MXFP4
    quantize-dequantized (dynamic MXFP4 activations) as the kernels read them. summed=False: the slots unsummed
    (sum_slots)."""
    tokens, top_k = topk_ids.shape
    num_pairs = tokens * top_k
    if num_pairs == 0:
        return torch.empty_like(x)
    config = config or default_config(gate_up, down)
    for weights, tiles in ((gate_up, config.gate_up), (down, config.down)):
        if weights.mxfp4 and (K_ALIGN % tiles.block_k or tiles.block_k % mxfp4.BLOCK):
            raise ValueError(f"MXFP4 expert weights (padded along K to a multiple of {K_ALIGN}) are read in K tiles "
                             f"of a multiple of {mxfp4.BLOCK} dividing {K_ALIGN}, not block_k {tiles.block_k}")
    ids = topk_ids.reshape(-1).contiguous()
    inner = gate_up_gemv(x, gate_up, ids, top_k, quantize_x, config.gate_up)
    pair_out = down_gemv(inner, down, ids, topk_weights.reshape(-1).contiguous(), quantize_x, config.down, x)
    return sum_slots(pair_out, tokens, top_k, x.dtype, summed=summed)


def gate_up_gemv(x: torch.Tensor, gate_up: ExpertWeights, ids: torch.Tensor, top_k: int, quantize_x: bool,
                 tiles: GemvTiles) -> torch.Tensor:
    """The first kernel of gemv_experts: gelu_tanh(gate) * up of each pair (ids: [pairs]), fp32 [pairs, inner]."""
    inner_size = gate_up.weight.shape[1] // 2
    inner = torch.empty((ids.numel(), inner_size), dtype=torch.float32, device=x.device)
    run_kernel(_gate_up_gemv_kernel, (ids.numel(), triton.cdiv(inner_size, tiles.block_n)), x, gate_up.weight,
               gate_up.scale, ids, inner, x.shape[1], inner_size, x.stride(0), *gate_up.strides(), inner.stride(0),
               TOP_K=top_k, QUANTIZE_X=quantize_x, EVEN_K=x.shape[1] % tiles.block_k == 0,
               BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps, **_modes(x, gate_up))
    return inner


def down_gemv(inner: torch.Tensor, down: ExpertWeights, ids: torch.Tensor, weights: torch.Tensor, quantize: bool,
              tiles: GemvTiles, x: torch.Tensor) -> torch.Tensor:
    """The second: each pair's routing weight times its down projection, fp32 [pairs, hidden] (x: the layer's
    input, whose dtype picks the weights' expansion)."""
    inner_size, hidden = inner.shape[1], down.weight.shape[1]
    pair_out = torch.empty((ids.numel(), hidden), dtype=torch.float32, device=inner.device)
    run_kernel(_down_gemv_kernel, (ids.numel(), triton.cdiv(hidden, tiles.block_n)), inner, down.weight,
               down.scale, ids, weights, pair_out, inner_size, hidden, inner.stride(0), *down.strides(),
               pair_out.stride(0), QUANTIZE_IN=quantize, EVEN_K=inner_size % tiles.block_k == 0,
               ONE_TILE=inner_size <= tiles.block_k,
               BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps, **_modes(x, down))
    return pair_out
