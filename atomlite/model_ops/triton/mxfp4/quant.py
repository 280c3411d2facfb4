"""MXFP4 in Triton: dynamic activation quantization (per 32 along K, Quark's "even" rounding) and exact
decoding of e2m1 codes."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel
from atomlite.model_ops.triton.mxfp4.tuning import (QUANTIZE_DEQUANTIZE_BLOCK_K, QUANTIZE_DEQUANTIZE_ROWS,
                                                    QUANTIZE_DEQUANTIZE_WARPS)


@triton.jit
def block_exponent(amax):
    """The shared exponent (int32, in [-127, 127]) of a block whose largest magnitude is amax (fp32): amax rounded to
    a power of two ("even" rounding), less e2m1's largest exponent 2. It grows with amax, so the largest amax of
    several blocks gives the largest of their exponents."""
    rounded_exponent = ((amax.to(tl.int32, bitcast=True) + 0x200000) >> 23) & 0xFF
    return tl.minimum(tl.maximum(rounded_exponent - 129, -127), 127)


@triton.jit
def pow2(biased_exponent):
    """2^(biased_exponent - 127) as fp32 for int32 exponents; 0 where that is under 2^-126."""
    return (tl.maximum(biased_exponent, 0) << 23).to(tl.float32, bitcast=True)


@triton.jit
def quantize_blocks(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """fp32 [ROWS, COLS] -> (signed e2m1 values [ROWS, COLS], block exponents int32 [ROWS, COLS/32]): x is about
    value * 2^exponent. Blocks whose amax is under ~2^-124 get exponent -127."""
    blocks = tl.reshape(x, (ROWS, COLS // 32, 32))
    exponent = block_exponent(tl.max(tl.abs(blocks), axis=2))
    inverse_scale = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    a = tl.abs(blocks * inverse_scale[:, :, None])
    # Half-even ties go to the code with mantissa bit 0: 0, 1, 2, 4 (hence >= at 0.75, 1.75, 3.5).
    q = tl.where(a > 5.0, 6.0, tl.where(a >= 3.5, 4.0, tl.where(a > 2.5, 3.0, tl.where(a >= 1.75, 2.0, tl.where(
        a > 1.25, 1.5, tl.where(a >= 0.75, 1.0, tl.where(a > 0.25, 0.5, 0.0)))))))
    return tl.reshape(tl.where(blocks < 0, -q, q), (ROWS, COLS)), exponent


@triton.jit
def e2m1_to_float_wide(code, scale_byte, FP32: tl.constexpr):
    """Nibble codes (int32) and their blocks' e8m0 bytes (int32) -> e2m1 value * 2^(scale - 127), exactly, for any
    scale byte from 2 up (fp32, or bf16 with FP32 False): the scale goes straight into the exponent bits."""
    mag = code & 7
    exp_minus_1 = tl.maximum(scale_byte, 2) - 1
    if FP32:
        bits = tl.where(mag >= 2, (mag << 22) + (exp_minus_1 << 23), tl.where(mag == 1, exp_minus_1 << 23, 0))
        value = (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)
    else:
        bits = tl.where(mag >= 2, (mag << 6) + (exp_minus_1 << 7), tl.where(mag == 1, exp_minus_1 << 7, 0))
        value = (bits | ((code & 8) << 12)).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return value


@triton.jit
def _quantize_dequantize_kernel(x, out, M, K, stride_xm, stride_om, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rm < M)[:, None] & (rk < K)[None, :]
    tile = tl.load(x + rm[:, None] * stride_xm + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    q, exponent = quantize_blocks(tile, BLOCK_M, BLOCK_K)
    # 2^exponent is 0 for exponent -127: such blocks come out as zeros
    scale = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    qdq = tl.reshape(tl.reshape(q, (BLOCK_M, BLOCK_K // 32, 32)) * scale[:, :, None], (BLOCK_M, BLOCK_K))
    tl.store(out + rm[:, None] * stride_om + rk[None, :], qdq.to(out.dtype.element_ty), mask=mask)


def quantize_dequantize(x: torch.Tensor) -> torch.Tensor:
    """Dynamic MXFP4 activation quantization of x [M, K] (K a multiple of 32), in x's dtype."""
    out = torch.empty_like(x)
    block_m, block_k = QUANTIZE_DEQUANTIZE_ROWS, QUANTIZE_DEQUANTIZE_BLOCK_K
    grid = (triton.cdiv(x.shape[0], block_m), triton.cdiv(x.shape[1], block_k))
    run_kernel(_quantize_dequantize_kernel, grid, x, out, x.shape[0], x.shape[1], x.stride(0), out.stride(0),
                                      BLOCK_M=block_m, BLOCK_K=block_k, num_warps=QUANTIZE_DEQUANTIZE_WARPS)
    return out
