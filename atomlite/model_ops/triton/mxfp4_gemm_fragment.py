"""y = x @ W^T for MXFP4 weights and MXFP4-quantized activations (W4A4) as one bf16 MMA per 256-K step.

Both operands are dequantized exactly: an e2m1 value times its block's e8m0 scale has at most two significant bits,
so it is a bf16 value (for scale bytes up to 128; larger ones take the fp8 kernel), and the products are exact in the
fp32 accumulator. No per-block scaling of MMA results is left, so the cost per step does not grow with the rows of x
(the fp8 kernel scales every block's sums): from 17 to 64 rows this kernel measured faster on an H100.

Each thread expands whole 32-bit words of packed weights (eight codes: a shift-and-mask pair per two values, times
2^(scale - 1) as one bf16x2 multiply, on NVIDIA as PTX) straight into the registers of its wgmma A fragment: in the
step's K order used here (fragment order), thread t of a row's four threads holds the values of words 8t .. 8t + 7,
so its loads are contiguous and no register shuffles are needed. x is written in the same K order by the
quantization kernel; the order is a permutation within each step, so the dot product is unchanged.
"""
import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting
from atomlite.model_ops.triton.mxfp4_gemm_fp8 import (SPLIT_K_BELOW_TILES, STEP_K, _dependent_launch,
                                                      _e8m0_to_float, _store, _tile_ids, gdc_launch_dependents,
                                                      gdc_wait, split_launch)
from atomlite.model_ops.triton.mxfp4_quant import quantize_blocks

STEP = tl.constexpr(STEP_K)  # for use inside the kernels
MIN_M = 17  # up to mxfp4_gemm_fp8.MAX_M rows; below, the fp8 kernel measured as fast or faster (H100)


@dataclass(frozen=True, slots=True)
class FragmentConfig:
    block_m: int  # rows of x per tile (the MMA's N), a multiple of 16
    block_n: int
    num_warps: int
    num_stages: int
    split_k: int = 1


ROWS_32 = FragmentConfig(block_m=32, block_n=64, num_warps=4, num_stages=3)


def pick_config(m: int, n: int) -> FragmentConfig:
    """32-row tiles; K split 4 ways under SPLIT_K_BELOW_TILES / 2 output tiles, 2 ways under SPLIT_K_BELOW_TILES."""
    tiles = triton.cdiv(m, ROWS_32.block_m) * triton.cdiv(n, ROWS_32.block_n)
    if tiles >= SPLIT_K_BELOW_TILES:
        return ROWS_32
    return dataclasses.replace(ROWS_32, split_k=4 if tiles < SPLIT_K_BELOW_TILES // 2 else 2)


# One word (eight codes; code j in bits 4j..4j+3) and its block's bf16x2 factor 2^(scale - 1) -> four bf16x2 pairs
# (code 0, code 4), (1, 5), (2, 6), (3, 7). A code's magnitude bits go to bf16 bits 8..6 and its sign to bit 15,
# which is its value times 2^-126 (code 1, 0.5, comes out subnormal, exactly); the multiply by 2^(scale - 1) is exact.
_E2M1X8_TO_BF16_PAIRS_PTX = tl.constexpr("""
{
.reg .b32 a, b;
shl.b32 a, $4, 6;
and.b32 a, a, 0x01C001C0;
shl.b32 b, $4, 12;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $0, a, $5;
shl.b32 a, $4, 2;
and.b32 a, a, 0x01C001C0;
shl.b32 b, $4, 8;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $1, a, $5;
shr.u32 a, $4, 2;
and.b32 a, a, 0x01C001C0;
shl.b32 b, $4, 4;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $2, a, $5;
shr.u32 a, $4, 6;
and.b32 a, a, 0x01C001C0;
and.b32 b, $4, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $3, a, $5;
}
""")


@triton.jit
def _e2m1_value(code, factor):
    """Portable path (interpreter, fp32): nibble codes (int32) -> e2m1 value * factor, in fp32."""
    magnitude = code & 7
    mantissa = (magnitude & 1).to(tl.float32)
    exponent = magnitude >> 1
    value = tl.where(exponent == 0, 0.5 * mantissa, (1.0 + 0.5 * mantissa) * tl.exp2((exponent - 1).to(tl.float32)))
    return tl.where((code & 8) != 0, -value, value) * factor


@triton.jit
def _bf16_halves(pair):
    """int32 holding a bf16x2 -> [..., 2] bf16 (low half, high half)."""
    low = (pair & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
    high = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.join(low, high)


@triton.jit
def _fragment_order(pair0, pair1, pair2, pair3, ROWS: tl.constexpr):
    """pair_p [ROWS, 4 (t), 8 (j), 2 (e)]: the value of code p + 4e of word 8t + j -> [ROWS, 256] with that value at
    K position 32j + 8p + 2t + e (the wgmma A fragment of thread t holds positions 16c + 8h + 2t + e)."""
    joined = tl.join(tl.join(pair0, pair2), tl.join(pair1, pair3))  # (row, t, j, e, p // 2, p % 2)
    return tl.reshape(tl.permute(joined, (0, 2, 4, 5, 1, 3)), (ROWS, STEP))


@triton.jit
def _expand_step(words, scale_bytes, PTX: tl.constexpr, BLOCK_N: tl.constexpr):
    """One 256-K step of weights: int32 words [BLOCK_N, 32] and e8m0 bytes [BLOCK_N, 8] -> values [BLOCK_N, 256]
    in fragment order (bf16 with PTX, else fp32)."""
    scale = scale_bytes.to(tl.int32)
    words = tl.reshape(words, (BLOCK_N, 4, 8))  # word 8t + j
    if PTX:
        factor = _per_word(((scale + 126) << 7) * 0x10001, BLOCK_N)  # bf16x2 2^(scale - 1)
        p0, p1, p2, p3 = tl.inline_asm_elementwise(_E2M1X8_TO_BF16_PAIRS_PTX, "=r,=r,=r,=r,r,r", [words, factor],
                                                   dtype=(tl.int32,) * 4, is_pure=True, pack=1)
        values = _fragment_order(_bf16_halves(p0), _bf16_halves(p1), _bf16_halves(p2), _bf16_halves(p3), BLOCK_N)
    else:
        factor = _per_word(_e8m0_to_float(scale), BLOCK_N)
        values = _fragment_order(_code_pair(words, factor, 0), _code_pair(words, factor, 1),
                                 _code_pair(words, factor, 2), _code_pair(words, factor, 3), BLOCK_N)
    return values


@triton.jit
def _per_word(block_values, BLOCK_N: tl.constexpr):
    """[BLOCK_N, 8] per 32-block -> [BLOCK_N, 4 (t), 8 (j)] per word 8t + j (words 4b .. 4b + 3 are block b)."""
    return tl.reshape(tl.broadcast_to(tl.reshape(block_values, (BLOCK_N, 4, 2, 1)), (BLOCK_N, 4, 2, 4)),
                      (BLOCK_N, 4, 8))


@triton.jit
def _code_pair(words, factor, P: tl.constexpr):
    """Portable path: the values of codes P and P + 4 of each word, [..., 2]."""
    return tl.join(_e2m1_value((words >> (4 * P)) & 15, factor), _e2m1_value((words >> (4 * P + 16)) & 15, factor))


@triton.jit
def _quantize_kernel(x, xd, M, K, stride_xm, stride_dm, BLOCK_M: tl.constexpr, PDL: tl.constexpr):
    """x [M, K] -> its MXFP4 quantization, dequantized, into xd [M, K'] (zeros past K), each 256-K step in fragment
    order: position 32j + 8p + 2t + e holds x's element 64t + 8j + 4e + p of the step."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * STEP + tl.arange(0, STEP)
    tile = tl.load(x + rm[:, None] * stride_xm + rk[None, :], mask=(rm < M)[:, None] & (rk < K)[None, :], other=0.0)
    q, exponent = quantize_blocks(tile.to(tl.float32), BLOCK_M, STEP)
    scale = ((exponent + 127) << 23).to(tl.float32, bitcast=True)  # 0 for exponent -127, as quantize_dequantize
    values = tl.reshape(tl.reshape(q, (BLOCK_M, STEP // 32, 32)) * scale[:, :, None], (BLOCK_M, 4, 8, 2, 4))
    ordered = tl.reshape(tl.permute(values, (0, 2, 4, 1, 3)), (BLOCK_M, STEP))
    tl.store(xd + rm[:, None] * stride_dm + rk[None, :], ordered.to(xd.dtype.element_ty), mask=(rm < M)[:, None])
    if PDL:
        gdc_launch_dependents()  # the GEMM's programs may start; they wait for this grid before reading xd


@triton.jit
def _fragment_gemm_kernel(xd, w, w_scale, out, partials, arrivals, M, N, K_SPLIT, K_END, stride_xm, stride_wn,
                          stride_sn, stride_om, PTX: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr, PDL: tl.constexpr):
    """w as int32 words [N, K'/8] (stride_wn in words); one MMA per 256-K step into acc [BLOCK_N, BLOCK_M]."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_N)
    k_first = tl.program_id(1) * K_SPLIT
    k_end = tl.minimum(k_first + K_SPLIT, K_END)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn_safe = rn % N  # rows past the end re-read valid rows: no load masks; their results are not stored
    rm_safe = rm % M
    w_rows = w + rn_safe[:, None] * stride_wn + tl.arange(0, STEP // 8)[None, :]
    s_rows = w_scale + rn_safe[:, None] * stride_sn + tl.arange(0, STEP // 32)[None, :]
    x_rows = xd + rm_safe[:, None] * stride_xm + tl.arange(0, STEP)[None, :]
    scale_bytes = tl.load(s_rows + k_first // 32)
    if PDL:
        gdc_wait()  # for the quantization kernel launched just before: xd
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_first, k_end, STEP):
        k_next = tl.minimum(k0 + STEP, k_end - STEP)  # the last step re-reads its own scales
        scale_next = tl.load(s_rows + k_next // 32)  # loaded a step ahead (measured faster than in-step)
        w_tile = _expand_step(tl.load(w_rows + k0 // 8), scale_bytes, PTX, BLOCK_N)
        x_tile = tl.load(x_rows + k0)
        if PTX:
            acc = tl.dot(w_tile, tl.trans(x_tile), acc)
        else:
            acc = tl.dot(w_tile, tl.trans(x_tile.to(tl.float32)), acc, input_precision="ieee")
        scale_bytes = scale_next
    _store(out, partials, arrivals, acc, rm, rn, M, N, stride_om, SPLIT_K)


def quantize_activations(x: torch.Tensor, k_padded: int, ptx: bool) -> torch.Tensor:
    """x [M, K] -> MXFP4-quantized values [M, K'] in fragment order, as _fragment_gemm_kernel reads them (bf16 with
    PTX, else fp32)."""
    m, k = x.shape
    xd = torch.empty((m, k_padded), dtype=torch.bfloat16 if ptx else torch.float32, device=x.device)
    block_m = 16
    _quantize_kernel[(triton.cdiv(m, block_m), k_padded // STEP_K)](
        x, xd, m, k, x.stride(0), xd.stride(0), BLOCK_M=block_m, PDL=ptx and _dependent_launch(x), num_warps=4)
    return xd


def mxfp4_gemm_fragment(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        config: FragmentConfig | None = None) -> torch.Tensor:
    """MXFP4-quantized x [M, K] (bf16 or fp32, unit last stride) @ W^T -> [M, N] in x's dtype. weight [N, K'/2] and
    weight_scale [N, K'/32] with K' a multiple of 256 (mxfp4_gemm.pad_to_k_align) and scale bytes up to 128."""
    m = x.shape[0]
    n, k_padded = weight.shape[0], weight.shape[1] * 2
    config = config or pick_config(m, n)
    ptx = x.is_cuda and torch.version.cuda is not None and not interpreting()
    xd = quantize_activations(x, k_padded, ptx)
    pdl = ptx and _dependent_launch(x)
    launch = split_launch(x, n, k_padded, config.block_m, config.block_n, config.split_k)
    _fragment_gemm_kernel[launch.grid](
        xd, weight.view(torch.int32), weight_scale, launch.out, launch.partials, launch.arrivals, m, n,
        launch.k_split, k_padded, xd.stride(0), weight.stride(0) // 4, weight_scale.stride(0), launch.out.stride(0),
        PTX=ptx, SPLIT_K=launch.split_k, BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP_N=8, PDL=pdl,
        num_warps=config.num_warps, num_stages=config.num_stages, **({"launch_pdl": True} if pdl else {}))
    return launch.out
