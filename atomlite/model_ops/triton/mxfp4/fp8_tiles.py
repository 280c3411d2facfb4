"""y = x @ W^T for MXFP4 weights and MXFP4-quantized activations (W4A4), on fp8 tensor cores.

An e2m1 code is exact in fp8 e4m3: its three magnitude bits moved to e4m3's low exponent and top mantissa bits give
the value times 2^-6 (five bit operations per eight weights, on NVIDIA as PTX), and a quantized activation's e2m1
value is an e4m3 value as it is. So each 32-element block's dot product is an exact fp8 MMA; its sum is then
multiplied by the two blocks' e8m0 scales (and 2^6, once at the end) in fp32. Within every 32-block both sides use
the same K order (the low nibbles of the 16 bytes, then their high nibbles), which is the order the bytes expand in.

x is written block-diagonally with a period P: row Pm+j of x' holds row m of x in the blocks b with b % P == j and
zeros elsewhere, so one MMA over P blocks yields each row's P per-block sums in P columns; the scales apply per
column, and the columns of a row are summed once at the end. P trades MMA work and x' traffic (P times the minimum)
for fewer MMA waits and scaling passes (Triton waits for each MMA before its result is used). Per 256-K step, a
tile of BLOCK_M rows takes 8 / P MMAs into P * BLOCK_M columns (pick_config, measured on an H100):
- up to 4 rows, P = 8: one MMA per step, in 16 or 32 columns;
- up to 8 rows, P = 4 (2 MMAs); up to 32 rows, P = 2 in tiles of 16 rows (4 MMAs): 64 columns measured slower;
- more rows, P = 1: one 32-K MMA per block.
One kernel (_fp8_gemm_kernel) serves every P. The scales of the next K step are loaded during this one and kept as
loaded bytes until used: converted at once, their load stalled the step that issued it (the top stall reason in
Nsight Compute). Triton's pipeliner does not take these narrow loads; a 16-byte aligned scale layout that it did
pipeline measured slower. On sm_90 the GEMM is a programmatic dependent launch: its programs start as the
quantization kernel finishes, and wait for it (griddepcontrol) before reading x'.
"""
import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host tensor descriptors: pointer loads only
    TensorDescriptor = None

from atomlite.model_ops.carriers import PartialSums, QuantizedRows
from atomlite.model_ops.triton.activation import gelu_tanh
from atomlite.model_ops.triton.common import (dependent_launches, gdc_launch_dependents, gdc_wait, interpreting,
                                              nvidia_capability, pdl_launch, platform_of, run_kernel)
from atomlite.model_ops.triton.mxfp4.quant import quantize_blocks
from atomlite.model_ops.triton.mxfp4.tuning import (FP8_QUANTIZE_ROWS, FP8_QUANTIZE_WARPS, GROUP_N, PER_BLOCK_32,
                                                    SPLIT_K_BELOW_TILES, SPLIT_K_FEW_TILES, SPLIT_K_FEWEST_TILES,
                                                    SUM_BLOCK, SUM_WARPS, TILES, WIDE_DIAGONAL_2, WIDE_MIN_PART_STEPS,
                                                    WIDE_MIN_PROGRAMS, Fp8Config)

STEP_K = 256  # K per loop step; weights are padded to a multiple of it at load time


def pick_config(m: int, n: int, k_padded: int) -> Fp8Config:
    """The tiles for m rows of an [n, k_padded] weight (tuning.py): at 1-2 rows WIDE_DIAGONAL_2 where K is long enough,
    else the tile of TILES that holds m rows, K split where the output has few tiles."""
    if m <= WIDE_DIAGONAL_2.block_m:
        wide = _long_k_split(WIDE_DIAGONAL_2, m, n, k_padded)
        if wide is not None:
            return wide
    config = next((config for rows, config in TILES if m <= rows), PER_BLOCK_32)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    if tiles >= SPLIT_K_BELOW_TILES or config is PER_BLOCK_32:  # 32 rows: splitting measured slower
        return config
    split_k = SPLIT_K_FEWEST_TILES if tiles < SPLIT_K_BELOW_TILES // 2 else SPLIT_K_FEW_TILES
    return dataclasses.replace(config, split_k=split_k)


def _long_k_split(config: Fp8Config, m: int, n: int, k_padded: int) -> Fp8Config | None:
    """config with K split into parts of at most config.split_steps steps, and into enough parts for
    WIDE_MIN_PROGRAMS programs; None where that leaves a part fewer than WIDE_MIN_PART_STEPS steps."""
    steps = k_padded // STEP_K
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    parts = max(triton.cdiv(steps, config.split_steps), triton.cdiv(WIDE_MIN_PROGRAMS, tiles))
    return dataclasses.replace(config, split_k=parts) if steps >= parts * WIDE_MIN_PART_STEPS else None


def supported(x: torch.Tensor) -> bool:
    """fp8 e4m3 MMAs: NVIDIA sm_89 and newer (ROCm's fp8 MMAs differ per chip: the bf16 kernel runs there)."""
    return nvidia_capability(x.device) >= (8, 9)


def _dependent_launch(x: torch.Tensor) -> bool:
    """Programmatic dependent launch (NVIDIA sm_90+): the GEMM's programs start as the quantization kernel ends."""
    return dependent_launches(x.device)


def weight_loads(weight: torch.Tensor, tma: bool, block: list[int]) -> tuple[object, bool]:
    """The GEMM kernels' weight argument and TMA flag: with tma on Hopper (and in the interpreter), a tensor
    descriptor whose tiles land swizzled in shared memory, where one can address the weight; else the tensor, read
    through pointers."""
    if (tma and TensorDescriptor is not None and _tma_addressable(weight)
            and (interpreting() or nvidia_capability(weight.device) >= (9, 0))):
        return TensorDescriptor.from_tensor(weight, block), True
    return weight, False


def _tma_addressable(weight: torch.Tensor) -> bool:
    """TMA's rule: rows of unit stride, their starts 16-byte aligned."""
    row_bytes = weight.stride(0) * weight.element_size()
    return weight.stride(1) == 1 and row_bytes % 16 == 0 and weight.data_ptr() % 16 == 0


@triton.jit
def _weight_rows(w, rn, rn_safe, stride_wn, WIDTH: tl.constexpr, TMA: tl.constexpr):
    """Where a program's weight tiles come from: the first row of its tile (TMA), or its rows' pointers."""
    if TMA:
        at = tl.min(rn, axis=0)
    else:
        at = w + rn_safe[:, None] * stride_wn + tl.arange(0, WIDTH)[None, :]
    return at


@triton.jit
def _weight_tile(w, w_at, offset, TMA: tl.constexpr):
    """The tile at column offset: by TMA from descriptor w at row w_at, or through the pointers w_at."""
    if TMA:
        tile = w.load([w_at, offset])
    else:
        tile = tl.load(w_at + offset)
    return tile


# Four bytes (eight codes) -> the e4m3 bytes of their low nibbles and of their high nibbles (value * 2^-6 each):
# sign to bit 7, the three magnitude bits to bits 4..2.
_E2M1X8_TO_E4M3_PTX = tl.constexpr("""
{
.reg .b32 a, b;
shl.b32 a, $2, 4;
and.b32 a, a, 0x80808080;
shl.b32 b, $2, 2;
and.b32 b, b, 0x1C1C1C1C;
or.b32 $0, a, b;
and.b32 a, $2, 0x80808080;
shr.u32 b, $2, 2;
and.b32 b, b, 0x1C1C1C1C;
or.b32 $1, a, b;
}
""")


@triton.jit
def _expand_e4m3(packed, PTX: tl.constexpr):
    """uint8 [..., 16 * G] -> e4m3 (low-nibble values, high-nibble values), each times 2^-6."""
    if PTX:
        low, high = tl.inline_asm_elementwise(_E2M1X8_TO_E4M3_PTX, "=r,=r,r", [packed],
                                              dtype=(tl.float8e4nv, tl.float8e4nv), is_pure=True, pack=4)
    else:
        p = packed.to(tl.int32)
        low = (((p & 8) << 4) | ((p & 7) << 2)).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        high = ((p & 0x80) | ((p & 0x70) >> 2)).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    return low, high


@triton.jit
def _blockwise_k_order(low, high, ROWS: tl.constexpr, K: tl.constexpr):
    """Expanded low/high nibbles [ROWS, K/2] -> [ROWS, K]: per 32-block its 16 low values, then its 16 high ones."""
    pairs = tl.reshape(tl.join(low, high), (ROWS, K // 32, 16, 2))
    return tl.reshape(tl.permute(pairs, (0, 1, 3, 2)), (ROWS, K))


@triton.jit
def _e8m0_to_float(byte):
    """e8m0 bytes (int32) -> 2^(byte - 127) as fp32; byte 0 is the subnormal 2^-127."""
    return tl.where(byte == 0, 0x400000, byte << 23).to(tl.float32, bitcast=True)


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr):
    """Programs that share an x tile run close together (L2 reuse of x and of W across neighbouring N tiles)."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_size = GROUP_N * tiles_m
    first_n = (pid // group_size) * GROUP_N
    group_n = tl.minimum(tiles_n - first_n, GROUP_N)
    return (pid % group_size) // group_n, first_n + (pid % group_size) % group_n


@triton.jit
def _program_tile(M, N, K_SPLIT, K_END, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr):
    """This program's rows of x (rm), rows of W (rn) and K range [k_first, k_end)."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_N)
    k_first = tl.program_id(1) * K_SPLIT
    k_end = tl.minimum(k_first + K_SPLIT, K_END)
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N), k_first, k_end


@triton.jit
def _store(out, partials, acc, rm, rn, M, N, stride_om, SPLIT_K: tl.constexpr):
    """acc [BLOCK_N, rows] -> out[rm, rn], or with K split this split's fp32 partial sums into partials[split]
    (sum_splits adds them up)."""
    mask = (rm < M)[None, :] & (rn < N)[:, None]
    if SPLIT_K == 1:
        tl.store(out + rm[None, :] * stride_om + rn[:, None], acc.to(out.dtype.element_ty), mask=mask)
    else:
        tl.store(partials + tl.program_id(1) * M * N + rm[None, :] * N + rn[:, None], acc, mask=mask)


@triton.jit
def _sum_splits_kernel(partials, out, M, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr):
    """out [M, N] = the sum of partials [SPLIT_K, M, N] (fp32), BLOCK elements per program."""
    if PDL:
        gdc_wait()  # for the GEMM launched just before: its partials
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < M * N
    total = tl.load(partials + offsets, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLIT_K):
        total += tl.load(partials + split * M * N + offsets, mask=mask, other=0.0)
    tl.store(out + (offsets // N) * stride_om + offsets % N, total.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _summed_parts(at, mask, stride_part, PARTS: tl.constexpr):
    """The sum (fp32) of PARTS tiles stride_part apart, from at."""
    tile = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    for part in tl.static_range(1, PARTS):
        tile += tl.load(at + part * stride_part, mask=mask, other=0.0).to(tl.float32)
    return tile


@triton.jit
def activation_tile(at, mask, K, stride_part, GATED: tl.constexpr, PARTS: tl.constexpr):
    """The fp32 tile an activation quantization rounds, from x's pointers at: x itself, or with GATED
    gelu_tanh(gate) * up of x = [gate | up] (up K columns after gate); with PARTS > 1 each of those the sum of
    PARTS arrays stride_part apart."""
    tile = _summed_parts(at, mask, stride_part, PARTS)
    if GATED:
        tile = gelu_tanh(tile) * _summed_parts(at + K, mask, stride_part, PARTS)
    return tile


@triton.jit
def store_quantized(xq, x_scale, tile, rm, k0, M, K_PADDED, stride_qm, stride_sm, PERIOD: tl.constexpr,
                    BLOCK_M: tl.constexpr, STEP: tl.constexpr):
    """Quantizes the fp32 tile [BLOCK_M, STEP] of x (rows rm, columns from k0; those from K_PADDED on are not
    stored) into xq and x_scale as _fp8_gemm_kernel reads them (see _quantize_kernel). BLOCK_M is 1 when PERIOD > 1.
    """
    q, exponent = quantize_blocks(tile, BLOCK_M, STEP)
    low_then_high = tl.reshape(tl.permute(tl.reshape(q, (BLOCK_M, STEP // 32, 16, 2)), (0, 1, 3, 2)),
                               (BLOCK_M, STEP)).to(tl.float8e4nv)
    factor = ((exponent + 127) << 23).to(tl.float32, bitcast=True)  # 0 below 2^-126, as quantize_dequantize
    rk = k0 + tl.arange(0, STEP)
    rb = k0 // 32 + tl.arange(0, STEP // 32)
    if PERIOD == 1:
        tl.store(xq + rm[:, None] * stride_qm + rk[None, :], low_then_high,
                 mask=(rm < M)[:, None] & (rk < K_PADDED)[None, :])
    else:  # one row, rm; each of its PERIOD rows in xq holds every PERIOD-th block
        # The values and the zeros go by two masked stores of tensors laid out once: a tl.where per row made each
        # row's store convert its own tile's layout through shared memory (sm_90, 31B's residual update at batch 1:
        # 23 barriers with it, 9 without).
        zeros = tl.zeros_like(low_then_high)
        diagonal = (rk // 32 % PERIOD)[None, :]  # the row of xq that holds each column's block
        inside = (rk < K_PADDED)[None, :]
        for j in tl.static_range(PERIOD):
            at = xq + (rm * PERIOD + j)[:, None] * stride_qm + rk[None, :]
            tl.store(at, low_then_high, mask=(diagonal == j) & inside)
            tl.store(at, zeros, mask=(diagonal != j) & inside)
    tl.store(x_scale + rm[:, None] * stride_sm + rb[None, :], factor,
             mask=(rm < M)[:, None] & (rb < K_PADDED // 32)[None, :])


@triton.jit
def _quantize_kernel(x, xq, x_scale, M, K, stride_xm, stride_qm, stride_sm, stride_part,
                     PERIOD: tl.constexpr, BLOCK_M: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
                     GATED: tl.constexpr, PARTS: tl.constexpr):
    """x [M, K] -> e2m1 values as e4m3 in blockwise K order, zero-padded to xq's K, into xq [PERIOD M, K'] (row
    PERIOD m + j: row m's blocks b with b % PERIOD == j, zeros elsewhere; BLOCK_M 1 when PERIOD > 1), and
    2^exponent per block into x_scale [M, K'/32]. GATED: x is [gate | up] [M, 2K], quantized as gelu_tanh(gate) * up
    (fp32). PARTS > 1: x is the sum of PARTS such arrays, stride_part apart (split-K partial sums)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k0 = tl.program_id(1) * STEP
    rk = k0 + tl.arange(0, STEP)
    at = x + rm[:, None] * stride_xm + rk[None, :]
    mask = (rm < M)[:, None] & (rk < K)[None, :]
    if PDL:
        gdc_wait()  # a dependent launch too: for the kernel before, which wrote x
    tile = activation_tile(at, mask, K, stride_part, GATED, PARTS)
    store_quantized(xq, x_scale, tile, rm, k0, M, k0 + STEP, stride_qm, stride_sm, PERIOD, BLOCK_M, STEP)
    if PDL:
        gdc_launch_dependents()  # the GEMM's programs may start; they wait for this grid before reading xq


@triton.jit
def _columns8(t):
    """[R, 8] -> its 8 columns, each [R] (splits within each thread's registers)."""
    even, odd = tl.split(tl.reshape(t, (t.shape[0], 4, 2)))
    e0, e1 = tl.split(tl.reshape(even, (t.shape[0], 2, 2)))
    o0, o1 = tl.split(tl.reshape(odd, (t.shape[0], 2, 2)))
    c0, c4 = tl.split(e0)
    c2, c6 = tl.split(e1)
    c1, c5 = tl.split(o0)
    c3, c7 = tl.split(o1)
    return c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def _halves(t):
    """[R, 8] -> columns 0..3 and columns 4..7, each [R, 4]."""
    return tl.split(tl.permute(tl.reshape(t, (t.shape[0], 2, 4)), (0, 2, 1)))


@triton.jit
def _diagonal_dot(acc, w, w_at, x_rows, d, w_factor, x_factor, PTX: tl.constexpr, PERIOD: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, TMA: tl.constexpr):
    """Blocks P d .. P d + P - 1 of every row at once (P = PERIOD): x' row P m + j holds row m's block P d + j, so
    column (m, j) of the MMA is that block's sum. w_factor [BLOCK_N, P] and x_factor [BLOCK_M, P]: their scales."""
    low, high = _expand_e4m3(_weight_tile(w, w_at, d * 16 * PERIOD, TMA), PTX)
    sums = tl.dot(_blockwise_k_order(low, high, BLOCK_N, 32 * PERIOD), tl.trans(tl.load(x_rows + d * 32 * PERIOD)))
    factor = tl.reshape(w_factor[:, None, :] * x_factor[None, :, :], (BLOCK_N, PERIOD * BLOCK_M))
    return acc + sums * factor


@triton.jit
def _fp8_gemm_kernel(xq, x_scale, w, w_scale, out, partials, M, N, K_SPLIT, K_END, stride_xm,
                     stride_sm, stride_wn, stride_sn, stride_om, PTX: tl.constexpr, SPLIT_K: tl.constexpr,
                     PERIOD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr,
                     PDL: tl.constexpr, TMA: tl.constexpr):
    """8 / PERIOD MMAs per 256-K step, each over PERIOD blocks, into PERIOD * BLOCK_M columns."""
    COLUMNS: tl.constexpr = PERIOD * BLOCK_M
    rm, rn, k_first, k_end = _program_tile(M, N, K_SPLIT, K_END, BLOCK_M, BLOCK_N, GROUP_N)
    rn_safe = rn % N  # rows past the end re-read valid rows: no load masks; their results are not stored
    rm_safe = rm % M
    x_row = tl.reshape(PERIOD * rm_safe[:, None] + tl.arange(0, PERIOD)[None, :], (COLUMNS,))
    w_at = _weight_rows(w, rn, rn_safe, stride_wn, 16 * PERIOD, TMA)
    s_rows = w_scale + rn_safe[:, None] * stride_sn + tl.arange(0, 8)[None, :]
    x_rows = xq + x_row[:, None] * stride_xm + tl.arange(0, 32 * PERIOD)[None, :]
    xs_rows = x_scale + rm_safe[:, None] * stride_sm + tl.arange(0, 8)[None, :]
    w_bytes = tl.load(s_rows + k_first // 32)
    if PDL:
        gdc_wait()  # for the quantization kernel launched just before: xq and x_scale
        if SPLIT_K > 1:
            gdc_launch_dependents()  # sum_splits' programs may start; they wait for this grid's partials
    x_factors = tl.load(xs_rows + k_first // 32)
    acc = tl.zeros((BLOCK_N, COLUMNS), dtype=tl.float32)
    for k0 in range(k_first, k_end, 256):
        k_next = tl.minimum(k0 + 256, k_end - 256)  # the last step re-reads its own scales
        # Kept as bytes until used: converted here, the load's latency would stall this step.
        w_bytes_next = tl.load(s_rows + k_next // 32)
        x_factors_next = tl.load(xs_rows + k_next // 32)
        w_factors = _e8m0_to_float(w_bytes.to(tl.int32))
        d = k0 // (32 * PERIOD)
        if PERIOD == 8:
            acc = _diagonal_dot(acc, w, w_at, x_rows, d, w_factors, x_factors, PTX, 8, BLOCK_N, BLOCK_M, TMA)
        elif PERIOD == 4:
            w_low, w_high = _halves(w_factors)
            x_low, x_high = _halves(x_factors)
            acc = _diagonal_dot(acc, w, w_at, x_rows, d, w_low, x_low, PTX, 4, BLOCK_N, BLOCK_M, TMA)
            acc = _diagonal_dot(acc, w, w_at, x_rows, d + 1, w_high, x_high, PTX, 4, BLOCK_N, BLOCK_M, TMA)
        else:
            ws, xs = _columns8(w_factors), _columns8(x_factors)
            if PERIOD == 2:
                for j in tl.static_range(4):
                    acc = _diagonal_dot(acc, w, w_at, x_rows, d + j, tl.join(ws[2 * j], ws[2 * j + 1]),
                                        tl.join(xs[2 * j], xs[2 * j + 1]), PTX, 2, BLOCK_N, BLOCK_M, TMA)
            else:
                for j in tl.static_range(8):
                    acc = _diagonal_dot(acc, w, w_at, x_rows, d + j, ws[j][:, None], xs[j][:, None], PTX, 1,
                                        BLOCK_N, BLOCK_M, TMA)
        w_bytes, x_factors = w_bytes_next, x_factors_next
    rows = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_M, PERIOD)), axis=2) * 64.0  # the 2^-6 of the weight expansion
    _store(out, partials, rows, rm, rn, M, N, stride_om, SPLIT_K)


@dataclass(frozen=True, slots=True)
class SplitLaunch:
    """What a split-K launch of an [M, N] output needs besides its inputs (shared with mxfp4_gemm_lookup)."""
    grid: tuple[int, int]
    k_split: int  # K per split, a multiple of STEP_K
    split_k: int
    out: torch.Tensor
    partials: torch.Tensor  # fp32 [split_k, M, N] when K is split


def split_launch(m: int, dtype: torch.dtype, device: torch.device, n: int, k_padded: int, block_m: int,
                 block_n: int, split_k: int) -> SplitLaunch:
    """The grid, K per split and output buffers of an [m, n] GEMM output in dtype."""
    k_split = triton.cdiv(k_padded // STEP_K, split_k) * STEP_K
    split_k = triton.cdiv(k_padded, k_split)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split_k)
    out = torch.empty((m, n), dtype=dtype, device=device)
    partials = torch.empty((split_k, m, n) if split_k > 1 else (0,), dtype=torch.float32, device=device)
    return SplitLaunch(grid, k_split, split_k, out, partials)


def sum_splits(launch: SplitLaunch, pdl: bool, summed: bool = True) -> torch.Tensor | PartialSums:
    """launch.out, after the GEMM just launched: with K split, the sum of its partials (or with summed=False the
    partials themselves, for a consumer that adds them). With pdl the GEMM let this kernel launch early
    (griddepcontrol): its programs wait for the GEMM's partials while the GEMM finishes. This measured 0.2-3.3 us
    faster than the split that arrived last summing the others behind an atomic counter (H100)."""
    if launch.split_k == 1:
        return launch.out
    return add_partials(launch.partials, launch.out, pdl, summed)


def add_partials(partials: torch.Tensor, out: torch.Tensor, pdl: bool,
                 summed: bool = True) -> torch.Tensor | PartialSums:
    """out [M, N] = the sum of a split-K GEMM's fp32 partials [splits, M, N] (contiguous), by a kernel that waits
    for that GEMM where pdl; summed=False: the partials themselves, as PartialSums in out's dtype."""
    if not summed:
        return PartialSums(partials, out.dtype)
    m, n = out.shape
    run_kernel(_sum_splits_kernel, (triton.cdiv(m * n, SUM_BLOCK),),
        partials, out, m, n, out.stride(0), SPLIT_K=partials.shape[0], BLOCK=SUM_BLOCK, PDL=pdl,
        num_warps=SUM_WARPS, **pdl_launch(pdl))
    return out


def quantize_activations(x: torch.Tensor, k_padded: int, period: int,
                         gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 values [period * M, K'], fp32 block scales [M, K'/32]) as _fp8_gemm_kernel reads them;
    gated: x is [gate | up] [M, 2K] and gelu_tanh(gate) * up is quantized. x may also be [parts, M, K or 2K]:
    the quantization is of the parts' sum."""
    parts = x.shape[0] if x.dim() == 3 else 1
    rows = x if x.dim() == 2 else x[0]
    m, k = rows.shape[0], rows.shape[1] // 2 if gated else rows.shape[1]
    steps = k_padded // STEP_K
    xq = torch.empty((period * m, k_padded), dtype=torch.float8_e4m3fn, device=x.device)
    x_scale = torch.empty((m, k_padded // 32), dtype=torch.float32, device=x.device)
    block_m = FP8_QUANTIZE_ROWS if period == 1 else 1  # store_quantized takes one row when period > 1
    pdl = _dependent_launch(x)
    run_kernel(_quantize_kernel, (triton.cdiv(m, block_m), steps),
        x, xq, x_scale, m, k, rows.stride(0), xq.stride(0), x_scale.stride(0), x.stride(0) if parts > 1 else 0,
        PERIOD=period, BLOCK_M=block_m, STEP=STEP_K, PDL=pdl, GATED=gated, PARTS=parts, num_warps=FP8_QUANTIZE_WARPS,
        **pdl_launch(pdl))
    return xq, x_scale


def mxfp4_gemm_fp8(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   config: Fp8Config | None = None, gated: bool = False,
                   summed: bool = True) -> torch.Tensor | PartialSums:
    """MXFP4-quantized x [M, K] (bf16 or fp32, unit last stride) @ W^T -> [M, N] in x's dtype.
    weight [N, K'/2] and weight_scale [N, K'/32] with K' a multiple of 256 (mxfp4_gemm.pad_to_k_align).
    gated: x is [gate | up] [M, 2K]; the GEMM takes gelu_tanh(gate) * up. summed: as sum_splits."""
    config = config or pick_config(x.shape[0], weight.shape[0], weight.shape[1] * 2)
    quantized = quantize_activations(x, weight.shape[1] * 2, config.period, gated)
    return fp8_gemm(quantized, x.shape[0], x.dtype, weight, weight_scale, config, pdl=_dependent_launch(x),
                    summed=summed)


def quantized_fp8_gemm(x: QuantizedRows, weight: torch.Tensor, weight_scale: torch.Tensor,
                       summed: bool = True) -> torch.Tensor | PartialSums:
    """The GEMM on x quantized by the kernel just before it (which let it launch early where PDL exists)."""
    config = pick_config(x.rows, weight.shape[0], weight.shape[1] * 2)
    if config.period != x.period or x.values.shape[1] != weight.shape[1] * 2:
        raise ValueError(f"x was quantized with period {x.period} and K {x.values.shape[1]}; this GEMM reads period "
                         f"{config.period} and K {weight.shape[1] * 2}: ask input_quantization for the form")
    return fp8_gemm((x.values, x.scales), x.rows, x.dtype, weight, weight_scale, config,
                    pdl=_dependent_launch(weight), summed=summed)


def fp8_gemm(quantized: tuple[torch.Tensor, torch.Tensor], m: int, dtype: torch.dtype, weight: torch.Tensor,
             weight_scale: torch.Tensor, config: Fp8Config, pdl: bool,
             summed: bool = True) -> torch.Tensor | PartialSums:
    """The GEMM on quantize_activations(x, ..., config.period) of an x of m rows, output in dtype; pdl: launched
    dependent on the kernel just before (which must be that quantization, or a kernel that wrote it the same way:
    RMSNorm.add_to_residual's)."""
    xq, x_scale = quantized
    n, k_padded = weight.shape[0], weight.shape[1] * 2
    launch = split_launch(m, dtype, weight.device, n, k_padded, config.block_m, config.block_n, config.split_k)
    w, tma = weight_loads(weight, config.tma, [config.block_n, 16 * config.period])
    run_kernel(_fp8_gemm_kernel, launch.grid,
        xq, x_scale, w, weight_scale, launch.out, launch.partials, m, n, launch.k_split,
        k_padded, xq.stride(0), x_scale.stride(0), weight.stride(0), weight_scale.stride(0), launch.out.stride(0),
        PTX=platform_of(weight.device).kind == "cuda", SPLIT_K=launch.split_k, PERIOD=config.period,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP_N=GROUP_N, PDL=pdl, TMA=tma, num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl_launch(pdl))
    return sum_splits(launch, pdl, summed)
