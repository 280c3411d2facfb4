"""y = x @ W^T for MXFP4 weights and MXFP4-quantized activations (W4A4) as one fp8 MMA per 256-K step.

Both operands carry their block scales, as fp8 e5m2 values (five exponent bits: room for the scales):
- A weight block's eight magnitudes times 2^(scale - 127 + 6), as e5m2 bytes, make a lookup table of two 32-bit
  registers, built from the scale byte with two integer operations (adding to each byte's exponent field). Each
  thread then expands whole 32-bit words of packed weights (eight codes) with byte permutes (PRMT, on NVIDIA as PTX):
  one looks up the four magnitudes of a half word, one more and a shift give the four signs: eleven instructions per
  eight weights in the SASS, plus a register copy of the sign table for each sign permute. The values land straight
  in the registers of the thread's wgmma A fragment: in the step's K order used here (lookup order), thread q of a
  row holds words 8q .. 8q + 7.
- x is quantized into e5m2 in the same K order by the quantization kernel, each 256-K step of a row times
  2^-r with r the step's largest block exponent minus 13, so that 27 binades of block scales are exact; blocks more
  than 26 binades below the step's largest round (their products are under 2^-24 of the largest block's).
Each step's MMA goes into a fresh accumulator (Hopper's fp8 MMAs accumulate with reduced precision), which is then
multiplied by 2^(r - 6) per row and added in fp32. No per-block scaling is left, so the instructions per step grow
little with the rows: about 360 SASS instructions per step at 16 rows and 420 at 64, against 470 for the 16-row fp8
tile (mxfp4_gemm_fp8, which scales every block's sums). On an H100 the fp8 MMA's sums differ from fp32 sums by up
to about 2e-4 of the output (tests/kernels/test_mxfp4_gemm.py).

On Hopper the weight tiles come by TMA (a tensor descriptor; Triton stages them swizzled in shared memory), which
measured faster than the pointer loads Triton pipelines through an unswizzled tile (bank conflicts on the threads'
32-byte row reads: 22% of the shared-memory wavefronts in Nsight Compute).

Weights whose nonzero blocks all have scale bytes in LOOKUP_SCALE_BYTES qualify (scale_bytes_fit, at load time);
others take the fp8 tiles. A block of zero codes is exact whatever its scale: table entry 0 stays 0.
"""
import dataclasses

import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.common import (gdc_launch_dependents, gdc_wait, interpreting, pdl_launch, platform_of,
                                              run_kernel)
from atomlite.model_ops.triton.mxfp4.fp8_tiles import (STEP_K, _dependent_launch, _program_tile, _store, _weight_rows,
                                                      _weight_tile, activation_tile, split_launch, sum_splits,
                                                      weight_loads)
from atomlite.model_ops.triton.mxfp4.quant import e2m1_to_float_wide, quantize_blocks
from atomlite.model_ops.triton.mxfp4.tuning import (GROUP_N, LOOKUP_QUANTIZE_ROWS, LOOKUP_QUANTIZE_WARPS, ROWS_16,
                                                    ROWS_32, ROWS_64, SPLIT_K_BELOW_TILES, SPLIT_K_FEW_TILES,
                                                    SPLIT_K_FEWEST_TILES, LookupConfig)

STEP = tl.constexpr(STEP_K)  # for use inside the kernels
# Table bytes for scale byte 127: e5m2 of the magnitudes 0, 0.5, 1, 1.5 (low word) and 2, 3, 4, 6 (high word)
# times 2^6. Byte 0 of the low word is a placeholder (0x50), masked to 0 after the scale is added: it carries the
# borrow of a negative scale into byte 1 the way the other bytes do.
WEIGHT_SHIFT = 6
SHIFT = tl.constexpr(WEIGHT_SHIFT)  # for use inside the kernels
LUT_LOW, LUT_HIGH = 0x56545050, 0x5E5C5A58
# Scale byte - 127 is added to every exponent field (5 bits): the smallest entry's (20) must stay >= 1 and the
# largest's (23) <= 30, so scales from 2^-19 to 2^7.
LOOKUP_SCALE_BYTES = range(127 - 19, 127 + 8)


def pick_config(m: int, n: int) -> LookupConfig:
    """The smallest row tile that holds m; K split where the output has few tiles (tuning.py)."""
    config = ROWS_16 if m <= 16 else ROWS_32 if m <= 32 else ROWS_64
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    if tiles >= SPLIT_K_BELOW_TILES:
        return config
    split_k = SPLIT_K_FEWEST_TILES if tiles < SPLIT_K_BELOW_TILES // 2 else SPLIT_K_FEW_TILES
    return dataclasses.replace(config, split_k=split_k)


def scale_bytes_fit(weight: torch.Tensor, weight_scale: torch.Tensor) -> bool:
    """Load-time check (it syncs): is every block with a nonzero code scaled within LOOKUP_SCALE_BYTES?"""
    if not weight_scale.numel():
        return True
    blocks = weight.reshape(*weight_scale.shape, -1)  # [..., N, K/32, 16 bytes]
    nonzero = (blocks & 0x77).amax(dim=-1) != 0
    outside = (weight_scale < LOOKUP_SCALE_BYTES.start) | (weight_scale >= LOOKUP_SCALE_BYTES.stop)
    return not bool((nonzero & outside).any())


# One word of codes (code i in bits 4i..4i+3) and t = (scale byte - 127) * 0x01010101 * 4 -> e5m2 values of codes
# 0..3 ($0) and 4..7 ($1). PRMT picks table bytes by the low 3 bits of each selector nibble (codes with their sign
# bit cleared); a set 4th bit makes it replicate the picked byte's top bit instead, so a table of 0x80 bytes gives
# 0xFF for negative codes and 0x80 for others, and that shifted left once has the sign in each byte's top bit.
_E2M1X8_TO_E5M2_PTX = tl.constexpr(f"""
{{
.reg .b32 lo, hi, m, s, t, c;
add.u32 lo, $3, {LUT_LOW:#x};
and.b32 lo, lo, 0xFFFFFF00;
add.u32 hi, $3, {LUT_HIGH:#x};
mov.b32 c, 0x80808080;
and.b32 m, $2, 0x77777777;
prmt.b32 t, lo, hi, m;
prmt.b32 s, c, c, $2;
shl.b32 s, s, 1;
and.b32 s, s, 0x80808080;
or.b32 $0, t, s;
shr.u32 m, m, 16;
shr.u32 s, $2, 16;
prmt.b32 t, lo, hi, m;
prmt.b32 s, c, c, s;
shl.b32 s, s, 1;
and.b32 s, s, 0x80808080;
or.b32 $1, t, s;
}}
""")


@triton.jit
def _block_scales(scale_words, BLOCK_N: tl.constexpr):
    """A step's scales as int32 words [BLOCK_N, 2] -> scale bytes [BLOCK_N, 2, 2, 2] (block 4a + 2b + c at
    [a, b, c])."""
    words = tl.broadcast_to(tl.reshape(scale_words, (BLOCK_N, 2, 1, 1)), (BLOCK_N, 2, 2, 2))
    shift = 8 * (2 * tl.arange(0, 2)[:, None] + tl.arange(0, 2)[None, :])
    return (words >> shift[None, None, :, :]) & 0xFF


@triton.jit
def _per_word(block_values, BLOCK_N: tl.constexpr):
    """[BLOCK_N, 2, 2, 2] per block -> [BLOCK_N, 4 (q), 8 (j)] per weight word: word 8q + j is in block 2q + j // 4.

    The form of the scale ops decides the layouts Triton picks for the expanded weights: the table shift computed
    after this broadcast, expand_dims for the reshape in _block_scales, or the scales loaded after the weights made
    it shuffle the weights between threads or pass them through shared memory (bench/fp4_gemm.py --compile-stats
    counts shared-memory stores and shuffles)."""
    blocks = tl.reshape(block_values, (BLOCK_N, 4, 2, 1))
    return tl.reshape(tl.broadcast_to(blocks, (BLOCK_N, 4, 2, 4)), (BLOCK_N, 4, 8))


@triton.jit
def _bytes4(v):
    """int32 -> its four bytes as e5m2, [..., 2, 2] (byte 2i + t at [i, t])."""
    b0 = (v & 0xFF).to(tl.uint8).to(tl.float8e5, bitcast=True)
    b1 = ((v >> 8) & 0xFF).to(tl.uint8).to(tl.float8e5, bitcast=True)
    b2 = ((v >> 16) & 0xFF).to(tl.uint8).to(tl.float8e5, bitcast=True)
    b3 = ((v >> 24) & 0xFF).to(tl.uint8).to(tl.float8e5, bitcast=True)
    return tl.join(tl.join(b0, b2), tl.join(b1, b3))


@triton.jit
def _expand_step(words, scale_words, PTX: tl.constexpr, BLOCK_N: tl.constexpr):
    """One 256-K step of weights: int32 words [BLOCK_N, 32] and scale words [BLOCK_N, 2] -> values times 2^6
    [BLOCK_N, 256] in lookup order (K position 32j + 16h + 4q + e holds code 4h + e of word 8q + j); e5m2 with PTX,
    else fp32."""
    scale = _block_scales(scale_words, BLOCK_N)
    words = tl.reshape(words, (BLOCK_N, 4, 8))  # word 8q + j
    if PTX:
        table_shift = _per_word((scale - 127) * 0x04040404, BLOCK_N)
        low, high = tl.inline_asm_elementwise(_E2M1X8_TO_E5M2_PTX, "=r,=r,r,r", [words, table_shift],
                                              dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        ordered = tl.permute(tl.reshape(tl.join(_bytes4(low), _bytes4(high)), (BLOCK_N, 4, 8, 4, 2)),  # (q, j, e, h)
                             (0, 2, 4, 1, 3))
    else:
        nibbles = words[:, :, :, None] >> (4 * tl.arange(0, 8))[None, None, None, :]
        word_scale = _per_word(scale + SHIFT, BLOCK_N)[:, :, :, None]
        values = tl.reshape(e2m1_to_float_wide(nibbles & 15, word_scale, True), (BLOCK_N, 4, 8, 2, 4))  # (q, j, h, e)
        ordered = tl.permute(values, (0, 2, 3, 1, 4))
    return tl.reshape(ordered, (BLOCK_N, STEP))


@triton.jit
def _quantize_kernel(x, xq, x_shift, M, K, stride_xm, stride_qm, stride_sm, BLOCK_M: tl.constexpr,
                     PDL: tl.constexpr, GATED: tl.constexpr):
    """x [M, K] -> its MXFP4 quantization times 2^-r per 256-K step (r: the step's largest block exponent - 13), as
    e5m2 (rounded through e5m2 into xq's dtype), in lookup order (position 32j + 16h + 4q + e holds element
    64q + 8j + 4h + e of the step), zeros past K, into xq [M, K']; 2^(r - 6) into x_shift [M, K'/256]. GATED: x is
    [gate | up] [M, 2K], quantized as gelu_tanh(gate) * up (fp32)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * STEP + tl.arange(0, STEP)
    if PDL:
        gdc_wait()  # a dependent launch too: for the kernel before, which wrote x
    at = x + rm[:, None] * stride_xm + rk[None, :]
    mask = (rm < M)[:, None] & (rk < K)[None, :]
    q, exponent = quantize_blocks(activation_tile(at, mask, K, 0, GATED, 1), BLOCK_M, STEP)
    r = tl.max(exponent, axis=1) - 13
    factor = tl.exp2((exponent - r[:, None]).to(tl.float32))
    values = tl.reshape(tl.reshape(q, (BLOCK_M, STEP // 32, 32)) * factor[:, :, None], (BLOCK_M, 4, 8, 2, 4))
    ordered = tl.reshape(tl.permute(values, (0, 2, 3, 1, 4)), (BLOCK_M, STEP)).to(tl.float8e5)
    tl.store(xq + rm[:, None] * stride_qm + rk[None, :], ordered.to(xq.dtype.element_ty), mask=(rm < M)[:, None])
    shift = tl.exp2((r - SHIFT).to(tl.float32))
    tl.store(x_shift + rm * stride_sm + tl.program_id(1), shift, mask=rm < M)
    if PDL:
        gdc_launch_dependents()  # the GEMM's programs may start; they wait for this grid before reading xq


@triton.jit
def _lookup_gemm_kernel(xq, x_shift, w, w_scale, out, partials, M, N, K_SPLIT, K_END, stride_xm,
                        stride_xsm, stride_wn, stride_sn, stride_om, PTX: tl.constexpr, SPLIT_K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr, PDL: tl.constexpr,
                        TMA: tl.constexpr):
    """w and w_scale as int32 words (stride_wn, stride_sn in words); one MMA per 256-K step into acc
    [BLOCK_N, BLOCK_M]. The scale words are loaded in the loop like the weights, so Triton pipelines both and
    gives them the layout the MMA operand needs (loaded a step ahead into registers instead, the scale bytes made
    Triton route the expanded weights through shared memory)."""
    rm, rn, k_first, k_end = _program_tile(M, N, K_SPLIT, K_END, BLOCK_M, BLOCK_N, GROUP_N)
    rn_safe = rn % N  # rows past the end re-read valid rows: no load masks; their results are not stored
    rm_safe = rm % M
    w_at = _weight_rows(w, rn, rn_safe, stride_wn, STEP // 8, TMA)
    s_rows = w_scale + rn_safe[:, None] * stride_sn + tl.arange(0, 2)[None, :]
    x_rows = xq + rm_safe[:, None] * stride_xm + tl.arange(0, STEP)[None, :]
    shift_rows = x_shift + rm_safe * stride_xsm
    if PDL:
        gdc_wait()  # for the quantization kernel launched just before: xq and x_shift
        if SPLIT_K > 1:
            gdc_launch_dependents()  # sum_splits' programs may start; they wait for this grid's partials
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_first, k_end, STEP):
        scale_words = tl.load(s_rows + k0 // 128)
        w_tile = _expand_step(_weight_tile(w, w_at, k0 // 8, TMA), scale_words, PTX, BLOCK_N)
        x_tile = tl.load(x_rows + k0)
        if PTX:
            sums = tl.dot(w_tile, tl.trans(x_tile))
        else:
            sums = tl.dot(w_tile, tl.trans(x_tile), input_precision="ieee")
        acc += sums * tl.load(shift_rows + k0 // STEP)[None, :]
    _store(out, partials, acc, rm, rn, M, N, stride_om, SPLIT_K)


def quantize_activations(x: torch.Tensor, k_padded: int, ptx: bool,
                         gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (values [M, K'] in lookup order, e5m2 with PTX else fp32; 2^(r - 6) per row and step, fp32
    [M, K'/256]) as _lookup_gemm_kernel reads them; gated: x is [gate | up] [M, 2K] and gelu_tanh(gate) * up is
    quantized."""
    m, k = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    steps = k_padded // STEP_K
    xq = torch.empty((m, k_padded), dtype=torch.float8_e5m2 if ptx else torch.float32, device=x.device)
    x_shift = torch.empty((m, steps), dtype=torch.float32, device=x.device)
    pdl = ptx and _dependent_launch(x)
    run_kernel(_quantize_kernel, (triton.cdiv(m, LOOKUP_QUANTIZE_ROWS), steps),
        x, xq, x_shift, m, k, x.stride(0), xq.stride(0), x_shift.stride(0), BLOCK_M=LOOKUP_QUANTIZE_ROWS,
        PDL=pdl, GATED=gated, num_warps=LOOKUP_QUANTIZE_WARPS, **pdl_launch(pdl))
    return xq, x_shift


def mxfp4_gemm_lookup(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      config: LookupConfig | None = None, gated: bool = False,
                      summed: bool = True) -> torch.Tensor | PartialSums:
    """MXFP4-quantized x [M, K] (bf16 or fp32, unit last stride) @ W^T -> [M, N] in x's dtype. weight [N, K'/2] and
    weight_scale [N, K'/32] with K' a multiple of 256 (mxfp4_gemm.pad_to_k_align), rows contiguous, and
    scale_bytes_fit(weight, weight_scale). gated: x is [gate | up] [M, 2K]; the GEMM takes gelu_tanh(gate) * up."""
    config = config or pick_config(x.shape[0], weight.shape[0])
    ptx = platform_of(x.device).kind == "cuda" and not interpreting()
    quantized = quantize_activations(x, weight.shape[1] * 2, ptx, gated)
    return lookup_gemm(quantized, x, weight, weight_scale, config, pdl=ptx and _dependent_launch(x), summed=summed)


def lookup_gemm(quantized: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, weight: torch.Tensor,
                weight_scale: torch.Tensor, config: LookupConfig, pdl: bool,
                summed: bool = True) -> torch.Tensor | PartialSums:
    """The GEMM on quantize_activations(x, ...) (x gives the output's rows, dtype and device); pdl: launched
    dependent on the kernel just before (which must be that quantization)."""
    xq, x_shift = quantized
    m = x.shape[0]
    n, k_padded = weight.shape[0], weight.shape[1] * 2
    launch = split_launch(m, x.dtype, x.device, n, k_padded, config.block_m, config.block_n, config.split_k)
    w, tma = weight_loads(weight.view(torch.int32), config.tma, [config.block_n, STEP_K // 8])
    run_kernel(_lookup_gemm_kernel, launch.grid,
        xq, x_shift, w, weight_scale.view(torch.int32), launch.out, launch.partials, m, n,
        launch.k_split, k_padded, xq.stride(0), x_shift.stride(0), weight.stride(0) // 4,
        weight_scale.stride(0) // 4, launch.out.stride(0), PTX=xq.dtype != torch.float32, SPLIT_K=launch.split_k,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP_N=GROUP_N, PDL=pdl, TMA=tma, num_warps=config.num_warps,
        num_stages=config.num_stages, **pdl_launch(pdl))
    return sum_splits(launch, pdl, summed)
