"""Fused MoE experts: out[t] = sum_k w[t, k] * down_e(gelu_tanh(gate_e x[t]) * up_e x[t]), e = topk_ids[t, k].

Pairs (token, slot) are grouped by expert into tiles of block_m rows (moe_routing). Then one launch per projection
for the whole layer: a program computes one tile's rows against one block of its expert's output features, so each
active expert's weights are read once per step at decode. gate_up gathers x rows by token and writes
gelu_tanh(gate) * up per row; down scales each row by its routing weight and writes it to that pair's row. A last
launch sums each token's top_k rows in slot order: deterministic, no atomics. Tiles the routing leaves unused exit
at once; a tile of at most tail_m rows (an expert's last) multiplies only those, and gate_up's last block of columns
only the columns left (26B-A4B's 704 on 128-wide tiles: 64). Weights are float [E, N, K], or
MXFP4 (packed e2m1 [E, N, K'/2] + e8m0 [E, N, K'/32], K' padded to K_ALIGN) expanded in registers as mxfp4_gemm's
portable path does. The ops (moe_experts, mxfp4_moe_experts) hand
batches of up to tuning.GEMV_MAX_PAIRS pairs to moe_gemv's kernels instead, which need no routing.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.activation import gelu_tanh
from atomlite.model_ops.triton.common import dot_precision, interpreting, platform_of, run_kernel
from atomlite.model_ops.triton.moe.common import (ExpertWeights, column_first_grid, quantize_dequantize_rows, sum_slots,
                                                  weight_pointers)
from atomlite.model_ops.triton.moe import gemv_fp8 as moe_gemv_fp8
from atomlite.model_ops.triton.moe.gemv import gemv_experts, use_gemv
from atomlite.model_ops.triton.moe.routing import ExpertTiles, group_by_expert
from atomlite.model_ops.triton.moe.tuning import (DECODE, DECODE_MAX_ROWS_PER_EXPERT, FP32_MAX_STAGES,
                                                  LARGE_MIN_ROWS_PER_EXPERT, MEDIUM, MEDIUM_MAX_ROWS_PER_EXPERT,
                                                  NVIDIA_LARGE_PREFILL, NVIDIA_MEDIUM, NVIDIA_PREFILL, PREFILL,
                                                  ROCM_MAX_STAGES, MoeConfig, ProjectionTiles)
from atomlite.model_ops.triton.mxfp4.gemm import K_ALIGN, _expand_tile
from atomlite.model_ops.triton.mxfp4.quant import quantize_dequantize
from atomlite.quant import mxfp4
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.moe import tuning
from atomlite.model_ops.triton.moe.routing import MAX_EXPERTS


def pick_config(num_pairs: int, num_experts: int, nvidia: bool = False, mxfp4: bool = False) -> MoeConfig:
    rows_per_expert = num_pairs / num_experts
    if rows_per_expert <= DECODE_MAX_ROWS_PER_EXPERT:
        return DECODE
    if rows_per_expert <= MEDIUM_MAX_ROWS_PER_EXPERT:
        return NVIDIA_MEDIUM if nvidia else MEDIUM
    if not nvidia:
        return PREFILL
    return NVIDIA_LARGE_PREFILL if rows_per_expert >= LARGE_MIN_ROWS_PER_EXPERT and not mxfp4 else NVIDIA_PREFILL


@triton.jit
def _tile_pairs(pair_of_row, tile_rows, tile, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """The first ROWS rows of a tile of BLOCK_M: (their indices, which hold a pair, the pair of each: 0 where
    none)."""
    rows = tile * BLOCK_M + tl.arange(0, ROWS)
    used = tl.arange(0, ROWS) < tl.load(tile_rows + tile)
    return rows, used, tl.load(pair_of_row + rows, mask=used, other=0)


@triton.jit
def _weight_tile(w_ptrs, s_ptrs, k0, K, MXFP4: tl.constexpr, FP32: tl.constexpr, WIDE_SCALES: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Weight values [BLOCK_N, BLOCK_K] at columns k0.. (MXFP4 weights are padded along K: no mask)."""
    if MXFP4:
        packed = tl.load(w_ptrs + k0 // 2)
        scale_byte = tl.load(s_ptrs + k0 // 32)
        tile = _expand_tile(packed, scale_byte, FP32, WIDE_SCALES, False, BLOCK_N, BLOCK_K)
    elif EVEN_K:
        tile = tl.load(w_ptrs + k0)
    else:
        tile = tl.load(w_ptrs + k0, mask=(k0 + tl.arange(0, BLOCK_K) < K)[None, :], other=0.0)
    if FP32:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _rows_tile(row_ptrs, k0, K, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    if EVEN_K:
        tile = tl.load(row_ptrs + k0)
    else:
        tile = tl.load(row_ptrs + k0, mask=(k0 + tl.arange(0, BLOCK_K) < K)[None, :], other=0.0)
    return tile


@triton.jit
def _used_rows_tile(row_ptrs, used, k0, K, BLOCK_K: tl.constexpr):
    return tl.load(row_ptrs + k0, mask=used[:, None] & (k0 + tl.arange(0, BLOCK_K) < K)[None, :], other=0.0)


@triton.jit
def _gate_up_rows(x, w, w_scale, pair_of_row, tile_rows, inner_out, tile, expert, n0, K, INNER, stride_xt, stride_we,
                  stride_wn, stride_se, stride_sn, stride_ir, TOP_K: tl.constexpr, MXFP4: tl.constexpr,
                  QUANTIZE_OUT: tl.constexpr, FP32: tl.constexpr, WIDE_SCALES: tl.constexpr, EVEN_K: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """gelu_tanh(gate) * up of the first ROWS rows of a tile, for output columns n0 + [0, BLOCK_N)."""
    rows, used, pair = _tile_pairs(pair_of_row, tile_rows, tile, BLOCK_M, ROWS)
    rn = n0 + tl.arange(0, BLOCK_N)
    rn_safe = rn % INNER  # rows past INNER re-read valid ones: no load mask; their columns are not stored
    gate_w, gate_s = weight_pointers(w, w_scale, expert, rn_safe, stride_we, stride_wn, stride_se, stride_sn,
                                      MXFP4, BLOCK_K)
    up_w, up_s = weight_pointers(w, w_scale, expert, rn_safe + INNER, stride_we, stride_wn, stride_se, stride_sn,
                                  MXFP4, BLOCK_K)
    x_rows = x + (pair // TOP_K)[:, None] * stride_xt + tl.arange(0, BLOCK_K)[None, :]
    acc_gate = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        gate = _weight_tile(gate_w, gate_s, k0, K, MXFP4, FP32, WIDE_SCALES, EVEN_K, BLOCK_N, BLOCK_K)
        up = _weight_tile(up_w, up_s, k0, K, MXFP4, FP32, WIDE_SCALES, EVEN_K, BLOCK_N, BLOCK_K)
        x_tile = _rows_tile(x_rows, k0, K, EVEN_K, BLOCK_K).to(gate.dtype)
        acc_gate = tl.dot(x_tile, tl.trans(gate), acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(x_tile, tl.trans(up), acc_up, input_precision=DOT_PRECISION)
    h = gelu_tanh(acc_gate) * acc_up
    if QUANTIZE_OUT:  # the down projection's dynamic MXFP4 input, per 32 of INNER (zeros past a partial block)
        h = quantize_dequantize_rows(tl.where((rn < INNER)[None, :], h, 0.0), ROWS, BLOCK_N)
    tl.store(inner_out + rows[:, None] * stride_ir + rn[None, :], h.to(inner_out.dtype.element_ty),
             mask=used[:, None] & (rn < INNER)[None, :])


@triton.jit
def _gate_up_columns(x, w, w_scale, pair_of_row, tile_rows, inner_out, tile, expert, n0, K, INNER, stride_xt,
                     stride_we, stride_wn, stride_se, stride_sn, stride_ir, TOP_K: tl.constexpr, MXFP4: tl.constexpr,
                     QUANTIZE_OUT: tl.constexpr, FP32: tl.constexpr, WIDE_SCALES: tl.constexpr,
                     EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One block of BLOCK_N output columns; TAIL_M < BLOCK_M: a tile of at most TAIL_M rows (an expert's last)
    computes only those."""
    if TAIL_M < BLOCK_M:
        if tl.load(tile_rows + tile) <= TAIL_M:
            _gate_up_rows(x, w, w_scale, pair_of_row, tile_rows, inner_out, tile, expert, n0, K, INNER, stride_xt,
                          stride_we, stride_wn, stride_se, stride_sn, stride_ir, TOP_K, MXFP4, QUANTIZE_OUT, FP32,
                          WIDE_SCALES, EVEN_K, DOT_PRECISION, BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K)
            return
    _gate_up_rows(x, w, w_scale, pair_of_row, tile_rows, inner_out, tile, expert, n0, K, INNER, stride_xt, stride_we,
                  stride_wn, stride_se, stride_sn, stride_ir, TOP_K, MXFP4, QUANTIZE_OUT, FP32, WIDE_SCALES, EVEN_K,
                  DOT_PRECISION, BLOCK_M, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _tile_and_column_block():
    """(tile, column block, column blocks) of this program: the launch order (common.column_first_grid) walks a
    tile's column blocks before the next tile's, so the programs that read one tile's input rows run together and
    find them in L2."""
    return tl.program_id(1), tl.program_id(0), tl.num_programs(0)


@triton.jit
def _gate_up_kernel(x, w, w_scale, pair_of_row, tile_expert, tile_rows, inner_out, K, INNER, stride_xt, stride_we,
                    stride_wn, stride_se, stride_sn, stride_ir, TOP_K: tl.constexpr, MXFP4: tl.constexpr,
                    QUANTIZE_OUT: tl.constexpr, FP32: tl.constexpr, WIDE_SCALES: tl.constexpr, EVEN_K: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    TAIL_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """TAIL_N < BLOCK_N: the last block of columns holds INNER's remainder, computed on TAIL_N columns alone."""
    tile, column_block, column_blocks = _tile_and_column_block()
    expert = tl.load(tile_expert + tile)
    if expert < 0:
        return
    n0 = column_block * BLOCK_N
    if TAIL_N < BLOCK_N:
        if column_block == column_blocks - 1:
            _gate_up_columns(x, w, w_scale, pair_of_row, tile_rows, inner_out, tile, expert, n0, K, INNER, stride_xt,
                             stride_we, stride_wn, stride_se, stride_sn, stride_ir, TOP_K, MXFP4, QUANTIZE_OUT, FP32,
                             WIDE_SCALES, EVEN_K, DOT_PRECISION, BLOCK_M, TAIL_M, TAIL_N, BLOCK_K)
            return
    _gate_up_columns(x, w, w_scale, pair_of_row, tile_rows, inner_out, tile, expert, n0, K, INNER, stride_xt,
                     stride_we, stride_wn, stride_se, stride_sn, stride_ir, TOP_K, MXFP4, QUANTIZE_OUT, FP32,
                     WIDE_SCALES, EVEN_K, DOT_PRECISION, BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K)


@triton.jit
def _down_rows(inner, w, w_scale, pair_of_row, tile_rows, topk_weights, pair_out, tile, expert, n0, K, N, stride_ir,
               stride_we, stride_wn, stride_se, stride_sn, stride_op, MXFP4: tl.constexpr, FP32: tl.constexpr,
               WIDE_SCALES: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
               ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The first ROWS rows of a tile through down, each scaled by its routing weight, into its pair's row."""
    rows, used, pair = _tile_pairs(pair_of_row, tile_rows, tile, BLOCK_M, ROWS)
    rn = n0 + tl.arange(0, BLOCK_N)
    w_ptrs, s_ptrs = weight_pointers(w, w_scale, expert, rn % N, stride_we, stride_wn, stride_se, stride_sn,
                                      MXFP4, BLOCK_K)
    in_rows = inner + rows[:, None] * stride_ir + tl.arange(0, BLOCK_K)[None, :]
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w_tile = _weight_tile(w_ptrs, s_ptrs, k0, K, MXFP4, FP32, WIDE_SCALES, EVEN_K, BLOCK_N, BLOCK_K)
        a = _used_rows_tile(in_rows, used, k0, K, BLOCK_K).to(w_tile.dtype)  # unused rows were never written
        acc = tl.dot(a, tl.trans(w_tile), acc, input_precision=DOT_PRECISION)
    routing_weight = tl.load(topk_weights + pair, mask=used, other=0.0).to(tl.float32)
    tl.store(pair_out + pair.to(tl.int64)[:, None] * stride_op + rn[None, :],
             (acc * routing_weight[:, None]).to(pair_out.dtype.element_ty), mask=used[:, None] & (rn < N)[None, :])


@triton.jit
def _down_kernel(inner, w, w_scale, pair_of_row, tile_expert, tile_rows, topk_weights, pair_out, K, N, stride_ir,
                 stride_we, stride_wn, stride_se, stride_sn, stride_op, MXFP4: tl.constexpr, FP32: tl.constexpr,
                 WIDE_SCALES: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """TAIL_M < BLOCK_M: a tile of at most TAIL_M rows (an expert's last) computes only those."""
    tile, column_block, _ = _tile_and_column_block()
    expert = tl.load(tile_expert + tile)
    if expert < 0:
        return
    n0 = column_block * BLOCK_N
    if TAIL_M < BLOCK_M:
        if tl.load(tile_rows + tile) <= TAIL_M:
            _down_rows(inner, w, w_scale, pair_of_row, tile_rows, topk_weights, pair_out, tile, expert, n0, K, N,
                       stride_ir, stride_we, stride_wn, stride_se, stride_sn, stride_op, MXFP4, FP32, WIDE_SCALES,
                       EVEN_K, DOT_PRECISION, BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K)
            return
    _down_rows(inner, w, w_scale, pair_of_row, tile_rows, topk_weights, pair_out, tile, expert, n0, K, N, stride_ir,
               stride_we, stride_wn, stride_se, stride_sn, stride_op, MXFP4, FP32, WIDE_SCALES, EVEN_K, DOT_PRECISION,
               BLOCK_M, BLOCK_M, BLOCK_N, BLOCK_K)


def _launch_options(tiles: ProjectionTiles, device: torch.device, fp32: bool) -> dict:
    stages = tiles.num_stages
    if platform_of(device).kind == "rocm":
        stages = min(stages, ROCM_MAX_STAGES)
    if fp32:
        stages = min(stages, FP32_MAX_STAGES)
    return dict(num_warps=tiles.num_warps, num_stages=stages)


def _fp32(dtype: torch.dtype) -> bool:
    """Values in fp32 for fp32 inputs and under the interpreter (its bf16 arithmetic is wrong)."""
    return dtype == torch.float32 or interpreting()


def _gate_up(x: torch.Tensor, gate_up: ExpertWeights, tiles: ExpertTiles, top_k: int, quantize_out: bool,
             config: MoeConfig) -> torch.Tensor:
    inner = gate_up.weight.shape[1] // 2
    hidden = x.shape[1]
    out = torch.empty((tiles.pair_of_row.shape[0], inner), dtype=x.dtype, device=x.device)
    t = config.gate_up
    grid = column_first_grid(tiles.max_tiles, triton.cdiv(inner, t.block_n))
    run_kernel(_gate_up_kernel, grid, x, gate_up.weight, gate_up.scale, tiles.pair_of_row, tiles.tile_expert,
               tiles.tile_rows, out, hidden, inner, x.stride(0), *gate_up.strides(), out.stride(0), TOP_K=top_k,
               MXFP4=gate_up.mxfp4, QUANTIZE_OUT=quantize_out, FP32=_fp32(x.dtype), WIDE_SCALES=gate_up.wide_scales,
               EVEN_K=hidden % t.block_k == 0, DOT_PRECISION=dot_precision(torch.float32 if _fp32(x.dtype)
                                                                            else x.dtype),
               BLOCK_M=config.block_m, TAIL_M=config.tail_m, BLOCK_N=t.block_n,
               TAIL_N=_tail_columns(inner, t.block_n, quantize_out), BLOCK_K=t.block_k,
               **_launch_options(t, x.device, _fp32(x.dtype)))
    return out


def _tail_columns(inner: int, block_n: int, quantize_out: bool) -> int:
    """The column tile of gate_up's last block: the power of two (from 16, a dot's least) holding inner's remainder,
    block_n where none is smaller or the inner quantization needs whole blocks of mxfp4.BLOCK columns."""
    tail = max(16, triton.next_power_of_2(inner % block_n))
    if inner % block_n == 0 or tail >= block_n or (quantize_out and tail % mxfp4.BLOCK):
        return block_n
    return tail


def _down(inner: torch.Tensor, down: ExpertWeights, tiles: ExpertTiles, topk_weights: torch.Tensor,
          config: MoeConfig) -> torch.Tensor:
    hidden, k = down.weight.shape[1], inner.shape[1]
    t = config.down
    fp32 = _fp32(inner.dtype)
    # each pair's row rounded to the activation dtype, as the unfused MoE writes it: at prefill these rows are
    # the step's largest write (and read again by the sum), twice the bytes in fp32
    pair_out = torch.empty((topk_weights.numel(), hidden), dtype=torch.float32 if fp32 else inner.dtype,
                           device=inner.device)
    grid = column_first_grid(tiles.max_tiles, triton.cdiv(hidden, t.block_n))
    run_kernel(_down_kernel, grid, inner, down.weight, down.scale, tiles.pair_of_row, tiles.tile_expert,
               tiles.tile_rows, topk_weights, pair_out, k, hidden, inner.stride(0), *down.strides(),
               pair_out.stride(0), MXFP4=down.mxfp4, FP32=fp32, WIDE_SCALES=down.wide_scales,
               EVEN_K=k % t.block_k == 0, DOT_PRECISION=dot_precision(torch.float32 if fp32 else inner.dtype),
               BLOCK_M=config.block_m, TAIL_M=config.tail_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
               **_launch_options(t, inner.device, fp32))
    return pair_out


def _check_config(config: MoeConfig, gate_up: ExpertWeights, down: ExpertWeights, quantize_inner: bool) -> None:
    tail = config.tail_m
    if tail > config.block_m or tail < 16 or tail & (tail - 1):
        raise ValueError(f"tail_m {tail} is not a power of two from 16 (a dot's rows) to block_m {config.block_m}")
    if quantize_inner and config.gate_up.block_n % mxfp4.BLOCK:
        raise ValueError(f"gate_up quantizes gelu(gate) * up per {mxfp4.BLOCK} columns in its tile: block_n "
                         f"{config.gate_up.block_n} is not a multiple of {mxfp4.BLOCK}")
    for weights, tiles in ((gate_up, config.gate_up), (down, config.down)):
        k_padded = weights.weight.shape[2] * 2
        if weights.mxfp4 and (K_ALIGN % tiles.block_k or tiles.block_k % mxfp4.BLOCK or k_padded % K_ALIGN):
            raise ValueError(f"MXFP4 expert weights padded along K to a multiple of {K_ALIGN} (got {k_padded}) are "
                             f"read in K tiles of a multiple of {mxfp4.BLOCK} dividing {K_ALIGN}, not block_k "
                             f"{tiles.block_k}")


def fused_experts(x: torch.Tensor, gate_up: ExpertWeights, down: ExpertWeights, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, quantize_inner: bool = False, config: MoeConfig | None = None,
                  summed: bool = True) -> torch.Tensor | PartialSums:
    """x [T, H] (unit last stride) through the routed experts -> [T, H] in x's dtype. quantize_inner: the down
    projection's input is MXFP4 quantize-dequantized (dynamic MXFP4 activations). summed=False: the slots
    unsummed (sum_slots)."""
    tokens, top_k = topk_ids.shape
    num_experts = gate_up.weight.shape[0]
    if tokens == 0:
        return torch.empty_like(x)
    config = config or pick_config(tokens * top_k, num_experts, platform_of(x.device).kind == "cuda",
                                   gate_up.mxfp4)
    _check_config(config, gate_up, down, quantize_inner)
    tiles = group_by_expert(topk_ids, num_experts, config.block_m)
    inner = _gate_up(x, gate_up, tiles, top_k, quantize_inner, config)
    weights = topk_weights.reshape(-1)
    if weights.stride(0) != 1:
        weights = weights.contiguous()
    return sum_slots(_down(inner, down, tiles, weights, config), tokens, top_k, x.dtype, summed=summed)


def moe_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, summed: bool = True) -> torch.Tensor | PartialSums:
    """Same contract as torch_ref.moe_experts: gate_up [E, 2I, H] (gate rows first), down [E, H, I]."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    gate_up, down = ExpertWeights(gate_up), ExpertWeights(down)
    if use_gemv(topk_ids.numel()):
        return gemv_experts(x, gate_up, down, topk_weights, topk_ids, quantize_x=False, summed=summed)
    return fused_experts(x, gate_up, down, topk_weights, topk_ids, summed=summed)


def mxfp4_moe_experts(x: torch.Tensor, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                      down_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, quantize_x: bool,
                      wide_scales: bool = True, summed: bool = True) -> torch.Tensor | PartialSums:
    """Same contract as torch_ref.mxfp4_moe_experts, on weights padded along K by mxfp4_gemm.pad_to_k_align (per
    expert); wide_scales=needs_wide_scales of either projection's scales (the default is always right)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    gate_up, down = ExpertWeights(gate_up, gate_up_scale, wide_scales), ExpertWeights(down, down_scale, wide_scales)
    if use_gemv(topk_ids.numel()):
        if moe_gemv_fp8.usable(x, gate_up, quantize_x):
            return moe_gemv_fp8.gemv_experts_fp8(x, gate_up, down, topk_weights, topk_ids, summed=summed)
        return gemv_experts(x, gate_up, down, topk_weights, topk_ids, quantize_x, summed=summed)
    if quantize_x:
        x = quantize_dequantize(x)
    return fused_experts(x, gate_up, down, topk_weights, topk_ids, quantize_inner=quantize_x, summed=summed)


def refuses_experts(op: str, dtypes: tuple[torch.dtype, ...]):
    """The fused experts' refusal: more experts than the routing holds, or a dtype it does not take."""
    def refuses(platform, shape: dict) -> str | None:
        if shape.get("experts", 0) > MAX_EXPERTS:
            return f"{shape['experts']} experts exceed the fused MoE routing's {MAX_EXPERTS}"
        if shape.get("dtype", torch.bfloat16) not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            return f"{op} takes {names}, not {shape['dtype']}"
        return None
    return refuses


# routing, gate_up, down and the sum over a token's experts: capture-safe; each slot's term as partial sums
declare("moe_experts", "triton", moe_experts, tuning=tuning, capabilities={"writes_partial_sums"},
        refuses=refuses_experts("moe_experts", (torch.bfloat16, torch.float16, torch.float32)))
