"""FP8 GEMM y = x W^T on e4m3 weights (portable Triton), as the checkpoint's activation semantics ask.

Activations are quantized first (quant.quantize_rows: per token, per group of 128, or with the static input scale;
or per token by the kernel that computed them, TokenRows), so the K loop streams fp8 tiles of x and W straight into
fp8 x fp8 tensor-core dots with fp32 accumulation. Weight-only layers (W8A16) dot x in its own dtype with the
weights widened (e4m3 values are exact in bf16). Scales: a per-row x scale and a per-column W scale (tensor,
channel) multiply the tile once at the end; per-K-block scales (x groups, W blocks) multiply each K step's product.
The weights are e4m3fn, or e4m3fnuz on gfx942 with their scales doubled at load (quant.fp8.to_e4m3fnuz).

Few rows (decode) are bound by streaming W: the K loop is split over programs until the GPU is full (split-K),
each program storing its scaled fp32 partial, and a second kernel adds them (mxfp4.fp8_tiles.add_partials). Many
rows use tensor-core tiles (tuning.py).
"""
import functools

import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.common import (dependent_launches, gdc_wait, interpreting, num_sms, pdl_launch,
                                              run_kernel)
from atomlite.model_ops.triton.fp8.quant import quantize_rows
from atomlite.model_ops.triton.fp8.tuning import LIBRARY_MIN_ROWS, FP8TileConfig, library_min_rows, tile_config
from atomlite.model_ops.triton.mxfp4 import blockwise
from atomlite.model_ops.triton.mxfp4.fp8_tiles import add_partials, weight_loads


@triton.jit
def _k_step(acc, w, x, k, xs_rows, ws_rows, ws_step, m_ok, n_ok, X_BLOCKS: tl.constexpr, W_BLOCKS: tl.constexpr,
            SCALE_K: tl.constexpr, FP32_DOT: tl.constexpr):
    """acc plus the product of the W tile [BLOCK_N, BLOCK_K] and the x tile [BLOCK_M, BLOCK_K] at column k, times
    their K-block scales where they have them."""
    if FP32_DOT:  # the interpreter and fp32 models: exact products, ieee sums
        x = x.to(tl.float32)
        w = w.to(tl.float32)
    elif x.dtype != w.dtype:  # W8A16: e4m3 values are exact in x's 16-bit dtype
        w = w.to(x.dtype)
    if X_BLOCKS or W_BLOCKS:
        part = tl.dot(w, tl.trans(x), input_precision="ieee") if FP32_DOT else tl.dot(w, tl.trans(x))
        if X_BLOCKS:
            part = part * tl.load(xs_rows + k // SCALE_K, mask=m_ok, other=0.0)[None, :]
        if W_BLOCKS:
            part = part * tl.load(ws_rows + (k // SCALE_K) * ws_step, mask=n_ok, other=0.0)[:, None]
        acc += part
    elif FP32_DOT:
        acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    else:
        acc = tl.dot(w, tl.trans(x), acc)
    return acc


@triton.jit
def _weight_tile(w_rows, k, kk, n_ok, k_ok, TMA: tl.constexpr, n_first):
    """W's tile at columns kk (from k): through the rows' pointers w_rows, or with TMA from descriptor w_rows at row
    n_first (zeros past W's edges)."""
    if TMA:
        tile = w_rows.load([n_first, k])
    else:
        tile = tl.load(w_rows[:, None] + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    return tile


@triton.jit
def scaled_tile(x_rows, xs_rows, w_rows, ws_rows, ws_step, m_ok, n_ok, k_lo, k_hi, X_BLOCKS: tl.constexpr,
                W_BLOCKS: tl.constexpr, SCALE_K: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False, TMA: tl.constexpr = False,
                n_first=0, tail_rows=None, tail_xs_rows=None, tail_ok=None, TAIL_M: tl.constexpr = 0):
    """sum over k in [k_lo, k_hi) of W[:, k] x[:, k]^T: the tile transposed, fp32 [BLOCK_N, BLOCK_M], so that W's
    rows fill the MMA's 64+ rows and a few rows of x (decode) its narrow side. x_rows / w_rows point at each tile
    row's start; with TMA, w_rows is W's tensor descriptor and the tile's rows start at n_first (k_hi must then be a
    multiple of BLOCK_K or W's K: the descriptor reads whole tiles). X_BLOCKS / W_BLOCKS: x's and W's scale of each
    SCALE_K-wide block of K (xs_rows + k // SCALE_K, ws_rows + k // SCALE_K * ws_step) multiplies that block's
    product; BLOCK_K divides SCALE_K and k_lo is a multiple of it. PDL: a dependent launch, which loads its first W
    tile before it waits for the kernel ahead (that wrote x and its scales; no kernel writes W), so the tile streams
    in while that kernel finishes. It does not let the kernel after it launch early: on 31B's FP8 decode that chained
    early launches (GEMM, norm, next GEMM), and the next GEMM's programs, placed among this one's, ran 1.4x longer
    (H200).
    TAIL_M: TAIL_M more rows of x (tail_rows, tail_xs_rows, tail_ok, as x_rows, xs_rows, m_ok) take a second,
    narrower product with the same W tile, so that a program holds BLOCK_M + TAIL_M rows (160 as 128 + 32, where a
    256-row tile would multiply 96 padded rows); returns (the tile, the tail's tile: one zero column without one)."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    tail = tl.zeros((BLOCK_N, TAIL_M if TAIL_M > 0 else 1), tl.float32)
    k_first = k_lo
    if PDL:
        kk = k_lo + rk
        k_ok = kk < k_hi
        w = _weight_tile(w_rows, k_lo, kk, n_ok, k_ok, TMA, n_first)
        gdc_wait()
        x = tl.load(x_rows[:, None] + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _k_step(acc, w, x, k_lo, xs_rows, ws_rows, ws_step, m_ok, n_ok, X_BLOCKS, W_BLOCKS, SCALE_K, FP32_DOT)
        if TAIL_M > 0:
            x = tl.load(tail_rows[:, None] + kk[None, :], mask=tail_ok[:, None] & k_ok[None, :], other=0.0)
            tail = _k_step(tail, w, x, k_lo, tail_xs_rows, ws_rows, ws_step, tail_ok, n_ok, X_BLOCKS, W_BLOCKS,
                           SCALE_K, FP32_DOT)
        k_first = k_lo + BLOCK_K
    for k in range(k_first, k_hi, BLOCK_K):
        kk = k + rk
        k_ok = kk < k_hi
        w = _weight_tile(w_rows, k, kk, n_ok, k_ok, TMA, n_first)
        x = tl.load(x_rows[:, None] + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _k_step(acc, w, x, k, xs_rows, ws_rows, ws_step, m_ok, n_ok, X_BLOCKS, W_BLOCKS, SCALE_K, FP32_DOT)
        if TAIL_M > 0:
            x = tl.load(tail_rows[:, None] + kk[None, :], mask=tail_ok[:, None] & k_ok[None, :], other=0.0)
            tail = _k_step(tail, w, x, k, tail_xs_rows, ws_rows, ws_step, tail_ok, n_ok, X_BLOCKS, W_BLOCKS,
                           SCALE_K, FP32_DOT)
    return acc, tail


@triton.jit
def scale_tile(acc, xs_rows, ws_rows, m_ok, n_ok, X_SCALED: tl.constexpr, X_BLOCKS: tl.constexpr,
               W_BLOCKS: tl.constexpr):
    """The once-per-tile scales of the transposed tile: x's per row (token, static), W's per column (tensor,
    channel)."""
    if X_SCALED and not X_BLOCKS:
        acc = acc * tl.load(xs_rows, mask=m_ok, other=0.0)[None, :]
    if not W_BLOCKS:
        acc = acc * tl.load(ws_rows, mask=n_ok, other=0.0)[:, None]
    return acc


@triton.jit
def fp8_gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, M, N, K, k_per_split, stride_xm, stride_xsm, stride_wn,
                    stride_wsn, stride_wsk, stride_ym, stride_split, X_SCALED: tl.constexpr, X_BLOCKS: tl.constexpr,
                    W_BLOCKS: tl.constexpr, SCALE_K: tl.constexpr, SPLIT: tl.constexpr, FP32_DOT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
                    TMA: tl.constexpr = False, TAIL_M: tl.constexpr = 0):
    """Program (n tile, m tile, K split), n tiles first: where the programs take more than one wave, W's tiles stream
    again for each m tile (tuning.row_tiles keeps the m tiles few). SPLIT: y is float32 [splits, M, N] partials
    (stride_split apart). PDL: a dependent launch (scaled_tile). TMA: w_ptr is W's tensor descriptor. TAIL_M: an m
    tile is BLOCK_M + TAIL_M rows (scaled_tile)."""
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * (BLOCK_M + TAIL_M) + tl.arange(0, BLOCK_M)
    rt = pid_m * (BLOCK_M + TAIL_M) + BLOCK_M + tl.arange(0, TAIL_M if TAIL_M > 0 else 1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, t_ok, n_ok = rm < M, (rt < M) & (TAIL_M > 0), rn < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    xs_rows, ts_rows = xs_ptr + rm * stride_xsm, xs_ptr + rt * stride_xsm
    ws_rows = ws_ptr + rn * stride_wsn
    w_rows = w_ptr if TMA else w_ptr + rn * stride_wn
    acc, tail = scaled_tile(x_ptr + rm * stride_xm, xs_rows, w_rows, ws_rows, stride_wsk, m_ok, n_ok, k_lo, k_hi,
                            X_BLOCKS, W_BLOCKS, SCALE_K, FP32_DOT, BLOCK_M, BLOCK_N, BLOCK_K, PDL, TMA,
                            pid_n * BLOCK_N, x_ptr + rt * stride_xm, ts_rows, t_ok, TAIL_M)
    _store_tile(acc, y_ptr + split * stride_split, rm, rn, xs_rows, ws_rows, m_ok, n_ok, stride_ym, X_SCALED,
                X_BLOCKS, W_BLOCKS)
    if TAIL_M > 0:
        _store_tile(tail, y_ptr + split * stride_split, rt, rn, ts_rows, ws_rows, t_ok, n_ok, stride_ym, X_SCALED,
                    X_BLOCKS, W_BLOCKS)


@triton.jit
def _store_tile(acc, y, rm, rn, xs_rows, ws_rows, m_ok, n_ok, stride_ym, X_SCALED: tl.constexpr,
                X_BLOCKS: tl.constexpr, W_BLOCKS: tl.constexpr):
    """The transposed tile of x rows rm and W rows rn, scaled once (scale_tile), into y [M, N]."""
    acc = scale_tile(acc, xs_rows, ws_rows, m_ok, n_ok, X_SCALED, X_BLOCKS, W_BLOCKS)
    tl.store(y + rm[None, :] * stride_ym + rn[:, None], acc.to(y.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


def num_splits(tiles: int, k_steps: int, device: torch.device, config: FP8TileConfig) -> int:
    """K splits that fill the GPU in one wave (config.programs_per_sm per multiprocessor), each split walking at
    least config.min_k_steps steps of BLOCK_K: 1 when the tiles alone fill it."""
    slots = config.programs_per_sm * num_sms(device)
    return max(1, min(slots // max(tiles, 1), k_steps // config.min_k_steps))


def scaled_mm(x: torch.Tensor, x_scale: torch.Tensor | None, weight: torch.Tensor, scale: torch.Tensor,
              scale_k: int, out_dtype: torch.dtype, summed: bool = True) -> torch.Tensor | PartialSums:
    """x [M, K] (e4m3 with x_scale [M, G], or 16/32-bit with x_scale None) @ weight [N, K]^T with scales [N, G'];
    scale_k: K per scale column where G or G' > 1. summed=False: split-K slices are returned unsummed (PartialSums)
    for a consumer that adds them as it reads them."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return y
    fp32_dot = interpreting() or x.dtype == torch.float32
    x_blocks = x_scale is not None and x_scale.shape[1] > 1
    w_blocks = scale.shape[1] > 1
    config = tile_config(m, x.device, fp32_dot, k_blocks=x_blocks or w_blocks, n=n, fp8_x=x.element_size() == 1)
    if x_blocks or w_blocks:
        assert scale_k % config.block_k == 0, f"BLOCK_K {config.block_k} must divide the scale blocks ({scale_k})"
    tiles = (triton.cdiv(n, config.block_n), triton.cdiv(m, config.block_m + config.tail_m))
    k_steps = triton.cdiv(k, config.block_k)
    splits = num_splits(tiles[0] * tiles[1], k_steps, x.device, config) if config.split_k else 1
    k_per_split = triton.cdiv(k_steps, splits) * config.block_k
    splits = triton.cdiv(k, k_per_split)
    target = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 else y
    xs = x_scale if x_scale is not None else scale  # unread without X_SCALED
    pdl = dependent_launches(x.device)
    w, tma = weight_loads(weight, config.tma, [config.block_n, config.block_k])
    run_kernel(fp8_gemm_kernel, (*tiles, splits), x, xs, w, scale, target, m, n, k, k_per_split,
               x.stride(0), xs.stride(0), weight.stride(0), scale.stride(0), scale.stride(1), target.stride(-2),
               target.stride(0) if splits > 1 else 0, X_SCALED=x_scale is not None,
               X_BLOCKS=x_blocks, W_BLOCKS=w_blocks, SCALE_K=scale_k or k, SPLIT=splits > 1, FP32_DOT=fp32_dot,
               BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, PDL=pdl, TMA=tma,
               TAIL_M=config.tail_m, num_warps=config.num_warps, num_stages=config.num_stages, **pdl_launch(pdl))
    if splits == 1:
        return y
    return add_partials(target, y, pdl, summed)


@functools.cache
def library_takes_row_scales(device: torch.device, fp8_dtype: torch.dtype) -> bool:
    """Whether torch._scaled_mm (cuBLASLt / hipBLASLt) runs e4m3 x e4m3 with a scale per row of x and per column of
    W on this GPU: asked once with a small product (at load, before any graph capture)."""
    a = torch.ones(16, 32, device=device).to(fp8_dtype)
    b = torch.ones(16, 32, device=device).to(fp8_dtype)
    ones = torch.ones(16, 1, device=device)
    try:
        y = torch._scaled_mm(a, b.t(), scale_a=ones, scale_b=ones.view(1, -1), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(y.float().eq(32.0).all())


def library_fits(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Many rows (tuning.library_min_rows) on a GPU whose library GEMM takes per-row x per-column scales: W per
    tensor or channel, N and K multiples of 16 (its layout rule), a bf16 result."""
    n, k = weight.shape
    return (x.is_cuda and x.shape[0] > library_min_rows(x.device) and not interpreting() and scale.shape[1] == 1
            and n % 16 == 0 and k % 16 == 0 and out_dtype == torch.bfloat16
            and library_takes_row_scales(x.device, weight.dtype))


def library_scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      out_dtype: torch.dtype) -> torch.Tensor:
    """xq [M, K] fp8 with x_scale [M, 1] @ weight [N, K]^T with scale [N, 1], fp32 sums, out_dtype: torch's GEMM."""
    return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=out_dtype)


@functools.cache
def library_takes_block_scales(device: torch.device) -> bool:
    """Whether torch's scaled_mm runs e4m3 x e4m3 with 1x128 block scales on both operands (cuBLAS on Hopper), each
    scale tensor with unit stride along its rows, and gives the dequantized product: asked once with a small random
    one (at load, before any graph capture)."""
    if not blockwise.has_block_scaling(device):
        return False
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(16, 256, device=device, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(32, 256, device=device, generator=gen).to(torch.float8_e4m3fn)
    a_scale = torch.rand(2, 16, device=device, generator=gen).add(0.5).t()
    b_scale = torch.rand(2, 32, device=device, generator=gen).add(0.5).t()
    want = ((a.float() * a_scale.repeat_interleave(128, 1)) @ (b.float() * b_scale.repeat_interleave(128, 1)).T)
    out = torch.empty(16, 32, dtype=torch.bfloat16, device=device)
    try:
        blockwise.blockwise_scaled_mm(a, a_scale, b, b_scale, out)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(torch.allclose(out.float(), want, rtol=2e-2, atol=1e-1))


def library_block_fits(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, activation: str | None,
                       group_size: int, scale_block_k: int) -> bool:
    """Many rows of bf16 x quantized in groups of 128 on W with 128-K block scales (unit stride along N), K and N
    as cuBLAS's block scaling takes them, on a GPU where it does."""
    n, k = weight.shape
    return (x.shape[0] > LIBRARY_MIN_ROWS and x.is_cuda and not interpreting() and activation == "group"
            and group_size == 128 and scale_block_k == 128 and k % 128 == 0 and scale.shape[1] == k // 128
            and scale.stride(0) == 1 and weight.dtype == torch.float8_e4m3fn and blockwise.supported(x, n)
            and library_takes_block_scales(x.device))


def library_block_mm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, group_size: int,
                     gated: bool = False) -> torch.Tensor:
    """x [M, K] quantized per group of 128 (quantize_rows, rows padded to 16 with zeros) @ weight [N, K]^T with
    scale [N, K / 128]: cuBLAS's fp8 GEMM with 1x128 block scales on both sides. gated: as fp8_gemm's."""
    m, n = x.shape[0], weight.shape[0]
    padded = -(-m // blockwise.ROWS_ALIGN) * blockwise.ROWS_ALIGN
    rows = x if padded == m else torch.nn.functional.pad(x, (0, 0, 0, padded - m))
    xq, x_scale = quantize_rows(rows, "group", weight.dtype, group_size, gated=gated)
    out = torch.empty(padded, n, dtype=x.dtype, device=x.device)
    blockwise.blockwise_scaled_mm(xq, x_scale.t().contiguous().t(), weight, scale, out)
    return out[:m]


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
             activation: str | None, group_size: int = 128, scale_block_k: int = 0,
             summed: bool = True, gated: bool = False) -> torch.Tensor | PartialSums:
    """x [M, K] @ W^T -> [M, N] in x's dtype; weight [N, K] fp8 (e4m3fn, or e4m3fnuz converted at load) with
    scales [N, G]; scale_block_k: K per scale column when G > 1. Activations are quantized once before the GEMM
    (quantizing groups inside its K loop measured 1.5-3x slower at decode on an H200; one row per token or static
    quantized in the K loop, with the same roundings, 2.5-3.4x the two launches at 31B's shapes: each step quantizes
    all 16 rows of the x tile). gated: x is [gate | up]
    [M, 2K] and the GEMM's input is gelu_tanh(gate) * up, computed as it is quantized (quantized activations only).
    Beyond tuning.library_min_rows, per-token or static x on a per-tensor or per-channel W goes to
    torch._scaled_mm, and beyond LIBRARY_MIN_ROWS grouped x on block-scaled W to its 1x128 block scaling where the
    GPU's library has it, as bf16's many rows go to F.linear."""
    if activation is None:
        assert not gated, "weight-only layers take gelu_tanh(gate) * up computed"
        return scaled_mm(x, None, weight, scale, scale_block_k, x.dtype, summed=summed)
    scale_k = group_size if activation == "group" else scale_block_k
    if activation == "group" and scale.shape[1] > 1:
        assert group_size == scale_block_k, "activation groups and weight blocks must span the same K"
    if library_block_fits(x, weight, scale, activation, group_size, scale_block_k):
        return library_block_mm(x, weight, scale, group_size, gated)
    xq, x_scale = quantize_rows(x, activation, weight.dtype, group_size, input_scale, gated=gated)
    return gemm_on_rows(xq, x_scale, weight, scale, scale_k, x.dtype, summed)


def gemm_on_rows(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, scale_k: int,
                 out_dtype: torch.dtype, summed: bool = True) -> torch.Tensor | PartialSums:
    """fp8_gemm on x quantized already (quant.quantize_rows, or the kernel before writing TokenRows): x's scales
    [M, 1] per token or static, or [M, K / scale_k] per group."""
    if x_scale.shape[1] == 1 and library_fits(xq, weight, scale, out_dtype):
        return library_scaled_mm(xq, x_scale, weight, scale, out_dtype)
    return scaled_mm(xq, x_scale, weight, scale, scale_k, out_dtype, summed=summed)
