"""Dynamic and static FP8 activation quantization (portable Triton): x rows -> e4m3 rows and their float32 scales,
before the GEMM, so the GEMM's K loop streams fp8 tiles into the tensor cores untouched.

Rounding to e4m3 is done in fp32 on the bits (round half to even on the e4m3fn grid, then an exact cast): the
same on every GPU and in the interpreter, whose fp8 conversion rounds wrongly. Where the cast itself rounds half to
even (NVIDIA sm_89+) the cast alone gives the same bits. On an e4m3fnuz GPU (gfx942) the same bits are half the
value, so the quantized x is halved before the cast and its scale doubled: the products are those of the
checkpoint's e4m3fn.

x may also be [gate | up] (GATED): the row quantized is gelu_tanh(gate) * up rounded to x's dtype, as the activation
kernel would have written it, so the down projection's input costs one launch, not two, where that is cheaper
(quantizes_gated_cheaply). On sm_90 the kernel is a dependent launch: it waits for the kernel before, and lets the
GEMM after it start (and stream its first weight tile) as it ends. A few wide rows per token (or a decode batch's very
wide ones) take two such launches (SPLIT_AMAX): the chunks' amaxes, then the values.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.activation import gelu_tanh
from atomlite.model_ops.triton.common import (dependent_launches, fp8_cast_rounds, gdc_launch_dependents, gdc_wait,
                                              interpreting, num_sms, pdl_launch, run_kernel)

MODES = {"static": 1, "token": 2, "group": 3}
E4M3_MAX = 448.0
FP32_EPS = 1.1920928955078125e-07  # a zero row's scale (compressed-tensors' eps): its values quantize to zeros
ROW_BLOCK = 32768  # at most this many K elements a program per token or static (a row up to it may be read once)
MIN_CHUNK = 1024  # at least this many K elements a program per token or static
GROUP_STEP = 1024  # K elements a program quantizes in groups (several groups at once, each its own scale)
# Many wide rows (a prefill's, per token or static): one program a row reads it LOOPED_BLOCK columns at a time, twice
# (its amax, then its values, the second read from L2), where a program holding the whole row in registers would pad
# it to a power of two. H200 (bench/fp8_quantize_rows.py, the cast rounding, common.fp8_cast_rounds): 128-512 rows
# 5376 wide 3.4-6.0 us against 4.4-6.9 whole; 31B's gated down input, 21504 wide, 2048 rows 124.8 against 198.4 (it
# splits its amax instead, below). Rows of a power of two fill their block and stay whole (8192 wide: 3.0-4.8 us at
# 128-512 rows against 3.3-5.6 looped, 2048 rows 16.6 against 19.8); so do narrower rows, whose difference was under
# a microsecond either way.
LOOPED_BLOCK, LOOPED_WARPS, LOOPED_MIN_ROWS, LOOPED_MIN_K = 2048, 8, 128, 4096
# Per token, a few rows from SPLIT_AMAX_WIDE columns, and any number of rows from SPLIT_AMAX_VERY_WIDE: two launches
# over chunks of SPLIT_AMAX_BLOCK columns, the first writing each chunk's amax, the second quantizing each chunk with
# its row's scale from them, so that no program reads a whole row. H200 (bench/fp8_quantize_rows.py, graphs of
# calls, the cast rounding): 31B's down input [gate | up] (21504 each), quantized gated, 1-512 rows 5.1-35.2 us
# against 9.4-39.5 the best other way, 2048 rows 121.8 against 124.1 looped (with the reciprocal 107.3 against
# 110.7); its o input (8192) 2.4-2.6 against 2.8-3.0 at 1-16 rows, slower from 32. 5376, 4096, 2816 and 2112 wide
# rows were slower split at every count from 1 to 512.
SPLIT_AMAX_FEW_ROWS, SPLIT_AMAX_WIDE, SPLIT_AMAX_VERY_WIDE = 16, 8192, 16384
SPLIT_AMAX_BLOCK, SPLIT_AMAX_WARPS = 2048, 4
# Per token, a gated row up to this wide is quantized from [gate | up] even where several programs each compute the
# whole row for its amax (quantizes_gated_cheaply): 26B-A4B's 2112 at 1 and 8 rows took 2.8 and 3.1 us that way,
# against 3.2 for the activation kernel and the quantization after it (H200, bench/fp8_quantize_rows.py).
GATED_WHOLE_ROW_MAX_K = 4096


@triton.jit
def round_e4m3(v):
    """v (fp32, |v| <= 448) rounded half-to-even onto the e4m3fn grid, as fp32."""
    a = tl.abs(v)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    # below 2^-6 the grid is 2^-9 apart; adding 1.5 * 2^23 rounds to an integer half to even
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
    r = tl.where(a >= 0.015625, normal, sub)
    return tl.where(v < 0, -r, r)


@triton.jit
def quantize_fp8(x, scale, FNUZ: tl.constexpr, FP8: tl.constexpr, CAST_ROUNDS: tl.constexpr = False,
                 RECIPROCAL: tl.constexpr = False):
    """x / scale as FP8; CAST_ROUNDS: the cast itself rounds half to even onto the e4m3fn grid (common.fp8_cast_rounds),
    which saves round_e4m3's integer work per value; RECIPROCAL: divided_by's."""
    q = tl.minimum(tl.maximum(divided_by(x, scale, RECIPROCAL), -448.0), 448.0)
    if not CAST_ROUNDS:
        q = round_e4m3(q)
    if FNUZ:
        q = q * 0.5
    return q.to(FP8)


@triton.jit
def divided_by(x, scale, RECIPROCAL: tl.constexpr):
    """x / scale rounded to nearest (fp32). RECIPROCAL, for scales from x's own amax (|x| <= 448 scale) in compiled
    code: x times scale's rounded reciprocal, corrected once by an fma (Markstein's step, as the GPU's own division
    does after its range check), which saves that division's per-value branch. A scale below 2^-60 is first raised
    with x by 2^64 (exact), so that the reciprocal stays finite. Checked exactly against the division for every
    bf16 value over scales with all-ones significands, and for random fp32 values, wherever the quotient is at least
    2^-12 (below, both quantize to zero)."""
    if RECIPROCAL:
        lift = tl.where(scale < 8.673617379884035e-19, 1.8446744073709552e19, 1.0)
        s = scale * lift
        v = x * lift
        inverse = tl.div_rn(1.0, s)
        q = v * inverse
        quotient = tl.where(q == 0.0, q, tl.fma(tl.fma(-q, s, v), inverse, q))
    else:
        quotient = tl.div_rn(x, scale)
    return quotient


@triton.jit
def amax_scale(x, AXIS: tl.constexpr = 0):
    """amax / 448 of fp32 x along AXIS, eps where it is zero. Divisions round to nearest (tl.div_rn) as torch's do: a
    GPU's default fp32 division may be a unit off, which moves a value across an e4m3 step."""
    scale = tl.div_rn(tl.max(tl.abs(x), axis=AXIS), 448.0)
    return tl.where(scale == 0.0, 1.1920928955078125e-07, scale)


@triton.jit
def load_activation(x_row, kk, K, GATED: tl.constexpr):
    """x_row's columns kk (< K) in fp32; GATED: gelu_tanh(gate) * up of the row [gate | up] (up K columns after gate),
    rounded to x's dtype as the activation kernel rounds its output."""
    values = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(x_row + K + kk, mask=kk < K, other=0.0).to(tl.float32)
        values = (gelu_tanh(values) * up).to(x_row.dtype.element_ty).to(tl.float32)
    return values


@triton.jit
def _row_scale(x_row, cols, K, static_ptr, row, stride_static, MODE: tl.constexpr, GATED: tl.constexpr,
               BLOCK: tl.constexpr):
    """Row `row`'s scale per token or static (MODE 1: static_ptr[row * stride_static]; 2: the amax of the whole row,
    read BLOCK columns at a time), fp32."""
    if MODE == 1:
        scale = tl.load(static_ptr + row * stride_static).to(tl.float32)
    else:
        amax = tl.zeros((BLOCK,), tl.float32)
        for k in range(0, K, BLOCK):
            amax = tl.maximum(amax, tl.abs(load_activation(x_row, k + cols, K, GATED)))
        scale = amax_scale(amax)
    return scale


@triton.jit
def chunk_amax_kernel(x_ptr, amax_ptr, K, stride_x, stride_a, BLOCK: tl.constexpr, GATED: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Program (row, chunk): amax_ptr[row, chunk] = the largest |x| of the row's chunk of BLOCK columns."""
    row, chunk = tl.program_id(0), tl.program_id(1)
    if PDL:
        gdc_wait()  # for the kernel before, which wrote x
    x = load_activation(x_ptr + row * stride_x, chunk * BLOCK + tl.arange(0, BLOCK), K, GATED)
    tl.store(amax_ptr + row * stride_a + chunk, tl.max(tl.abs(x), axis=0))
    if PDL:
        gdc_launch_dependents()  # the quantization's programs may start; they wait for this grid's amaxes


@triton.jit
def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, static_ptr, K, rows_per_source, stride_x, stride_q, stride_s,
                         stride_static, MODE: tl.constexpr, FNUZ: tl.constexpr, BLOCK: tl.constexpr,
                         WHOLE: tl.constexpr, GROUPS: tl.constexpr = 1, GATED: tl.constexpr = False,
                         PDL: tl.constexpr = False, LOOPED: tl.constexpr = False, AMAX_PARTS: tl.constexpr = 0,
                         CAST_ROUNDS: tl.constexpr = False, RECIPROCAL: tl.constexpr = False):
    """Row r of q is x row r // rows_per_source quantized: MODE 1 with static_ptr[r * stride_static], 2 with its
    own amax, 3 per BLOCK-wide group (BLOCK = the group size), each group's scale at s[r, group]. Program
    (row, chunk): chunk program_id(1) of BLOCK (modes 1, 2) or of GROUPS groups (mode 3) columns, so that a few
    rows spread over the GPU; per token, each program reads the whole row for its amax first, unless AMAX_PARTS
    (mode 2): then static_ptr holds each source row's chunk amaxes (chunk_amax_kernel), stride_static apart,
    AMAX_PARTS a power of two >= the chunks. WHOLE: the row is one chunk, read once. LOOPED: the row is one
    program's, read BLOCK at a time (modes 1, 2). GATED: x rows are [gate | up] (load_activation). CAST_ROUNDS, and
    RECIPROCAL (modes 2, 3 only): quantize_fp8's."""
    row, chunk = tl.program_id(0), tl.program_id(1)
    x_row = x_ptr + (row // rows_per_source) * stride_x
    q_row = q_ptr + row * stride_q
    s_row = s_ptr + row * stride_s
    cols = tl.arange(0, BLOCK)
    factor = 2.0 if FNUZ else 1.0  # fnuz holds half the value: the scale doubles
    if PDL:
        gdc_wait()  # for the kernel before, which wrote x
    if MODE == 3:
        group = chunk * GROUPS + tl.arange(0, GROUPS)
        kk = group[:, None] * BLOCK + cols[None, :]
        x = load_activation(x_row, kk, K, GATED)
        scale = amax_scale(x, 1)
        tl.store(q_row + kk, quantize_fp8(x, scale[:, None], FNUZ, q_ptr.dtype.element_ty, CAST_ROUNDS, RECIPROCAL),
                 mask=kk < K)
        tl.store(s_row + group, scale * factor, mask=group * BLOCK < K)
    elif LOOPED:
        scale = _row_scale(x_row, cols, K, static_ptr, row, stride_static, MODE, GATED, BLOCK)
        for k in range(0, K, BLOCK):
            x = load_activation(x_row, k + cols, K, GATED)
            q = quantize_fp8(x, scale, FNUZ, q_ptr.dtype.element_ty, CAST_ROUNDS, RECIPROCAL)
            tl.store(q_row + k + cols, q, mask=k + cols < K)
        tl.store(s_row, scale * factor)
    else:
        kk = chunk * BLOCK + cols
        x = load_activation(x_row, kk, K, GATED)
        if MODE == 2 and WHOLE:  # the row is this chunk, already loaded
            scale = amax_scale(x)
        elif AMAX_PARTS:
            parts = tl.arange(0, AMAX_PARTS)
            amaxes = tl.load(static_ptr + (row // rows_per_source) * stride_static + parts,
                             mask=parts < tl.num_programs(1), other=0.0)
            scale = amax_scale(amaxes)
        else:
            scale = _row_scale(x_row, cols, K, static_ptr, row, stride_static, MODE, GATED, BLOCK)
        q = quantize_fp8(x, scale, FNUZ, q_ptr.dtype.element_ty, CAST_ROUNDS, RECIPROCAL)
        tl.store(q_row + kk, q, mask=kk < K)
        if chunk == 0:
            tl.store(s_row, scale * factor)
    if PDL:
        gdc_launch_dependents()  # the GEMM's programs may start; they wait for this grid before reading q


def row_chunk(rows: int, k: int, device: torch.device) -> int:
    """Columns a program quantizes per token or static: the whole row (up to ROW_BLOCK) where the rows fill the GPU,
    else chunks of at least MIN_CHUNK (a decode row quantized by one program took 5-11 us at 31B's K on an H200)."""
    spread = max(1, num_sms(device) // max(rows, 1))
    return min(ROW_BLOCK, triton.next_power_of_2(max(MIN_CHUNK, triton.cdiv(k, spread))))


def quantizes_gated_cheaply(rows: int, k: int, activation: str | None, device: torch.device) -> bool:
    """Whether quantize_rows(gated=True) of rows [gate | up] (k wide each) beats the activation kernel followed by
    quantize_rows: where no program needs the whole row's amax (static or group scales, a row quantized whole by
    one program, or the chunk amaxes of SPLIT_AMAX, which compute gelu_tanh(gate) * up twice an element, once in
    each launch). Per token over several programs each would compute the whole row for its amax: 31B's 21504-wide
    down_proj input at one row took 13.7 us that way, against about 5 us for the two kernels (H200); up to
    GATED_WHOLE_ROW_MAX_K columns each program's whole row costs little."""
    if activation is None:
        return False
    return (activation != "token" or row_chunk(rows, k, device) >= k or k <= GATED_WHOLE_ROW_MAX_K
            or splits_amax(rows, k, activation))


def quantize_rows(x: torch.Tensor, activation: str, fp8_dtype: torch.dtype, group_size: int = 128,
                  static_scale: torch.Tensor | None = None, rows_per_source: int = 1, gated: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [S, K] -> (q [S * rows_per_source, K] fp8_dtype, scales float32 [rows, G]): G = 1 per token or static,
    ceil(K / group_size) per group. static_scale: one scale [1], or one per output row [rows] (MoE experts'
    own input scales). The scales already carry fnuz's factor 2. gated: x is [gate | up] [S, 2K], and
    gelu_tanh(gate) * up (in x's dtype) is quantized."""
    rows, k = x.shape[0] * rows_per_source, x.shape[1] // 2 if gated else x.shape[1]
    groups = triton.cdiv(k, group_size) if activation == "group" else 1
    q = torch.empty(rows, k, dtype=fp8_dtype, device=x.device)
    scales = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    if rows == 0:
        return q, scales
    if x.stride(-1) != 1:
        x = x.contiguous()
    static = static_scale if static_scale is not None else scales
    stride_static = 1 if static_scale is not None and static_scale.numel() > 1 else 0
    pdl = dependent_launches(x.device)
    split_amax = splits_amax(rows, k, activation)
    if split_amax:
        static = chunk_amaxes(x, k, gated, pdl)
        stride_static = static.stride(0)
    looped = activation != "group" and not split_amax and loops_over_rows(rows, k)
    block = (group_size if activation == "group" else LOOPED_BLOCK if looped else SPLIT_AMAX_BLOCK if split_amax
             else row_chunk(rows, k, x.device))
    per_program = max(1, min(GROUP_STEP // block, triton.next_power_of_2(groups))) if activation == "group" else 1
    width = block * per_program
    chunks = triton.cdiv(groups, per_program) if activation == "group" else 1 if looped else triton.cdiv(k, block)
    warps = LOOPED_WARPS if looped else 4 if width <= 2048 else 8 if width <= 8192 else 16
    amax_parts = {"AMAX_PARTS": triton.next_power_of_2(chunks)} if split_amax else {}
    run_kernel(quantize_rows_kernel, (rows, chunks), x, q, scales, static, k,
               rows_per_source, x.stride(0), q.stride(0), scales.stride(0), stride_static, MODE=MODES[activation],
               FNUZ=fp8_dtype == torch.float8_e4m3fnuz, BLOCK=block, WHOLE=block >= k, GROUPS=per_program,
               GATED=gated, PDL=pdl, LOOPED=looped, CAST_ROUNDS=fp8_cast_rounds(x.device),
               RECIPROCAL=activation != "static" and not interpreting(), num_warps=warps,
               **amax_parts, **pdl_launch(pdl))
    return q, scales


def loops_over_rows(rows: int, k: int) -> bool:
    """Whether one program a row reads it LOOPED_BLOCK columns at a time (per token or static; see LOOPED_MIN_K)."""
    return rows >= LOOPED_MIN_ROWS and k >= LOOPED_MIN_K and triton.next_power_of_2(k) != k


def splits_amax(rows: int, k: int, activation: str | None) -> bool:
    """Whether quantize_rows takes a row's amax from chunk_amax_kernel's chunks (per token: a few wide rows, or very
    wide ones)."""
    wide = k >= SPLIT_AMAX_WIDE and rows <= SPLIT_AMAX_FEW_ROWS
    return activation == "token" and k > SPLIT_AMAX_BLOCK and (wide or k >= SPLIT_AMAX_VERY_WIDE)


def chunk_amaxes(x: torch.Tensor, k: int, gated: bool, pdl: bool) -> torch.Tensor:
    """Each x row's amax per chunk of SPLIT_AMAX_BLOCK columns (of gelu_tanh(gate) * up where gated): float32
    [rows of x, chunks]."""
    chunks = triton.cdiv(k, SPLIT_AMAX_BLOCK)
    amaxes = torch.empty(x.shape[0], chunks, dtype=torch.float32, device=x.device)
    run_kernel(chunk_amax_kernel, (x.shape[0], chunks), x, amaxes, k, x.stride(0), amaxes.stride(0),
               BLOCK=SPLIT_AMAX_BLOCK, GATED=gated, PDL=pdl, num_warps=SPLIT_AMAX_WARPS, **pdl_launch(pdl))
    return amaxes
