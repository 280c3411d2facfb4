"""y = x @ W^T for many rows of MXFP4-quantized activations on Hopper: cuBLAS's fp8 GEMM with 1x128 block scales
(torch's scaled_mm), at twice bf16's tensor-core rate.

Both operands are rewritten as fp8 e4m3 values with one fp32 factor per row and 128-K group (four MXFP4 blocks):
each block's e2m1 values times 2^(its exponent - the group's largest + 6), and the factor 2^(the group's largest
exponent - 6), which cuBLAS applies per group in fp32. e2m1 values have one mantissa bit and e4m3's subnormals reach
2^-9, so this is exact for every block within 14 binades of its group's largest; a block further below rounds to
e4m3 (each element off by at most 2^-10, against 256 to 384 for the group's largest values). Groups whose factor
would be under 2^-126 (their largest exponent under -120) come out as zeros.

Activations are quantized once per call (_quantize_kernel); weights are expanded a slab of rows at a time on a side
stream, the next slab while the GEMM of this one runs (mxfp4_slabs), in e4m3: half the bytes of the bf16 slabs. On
NVIDIA the expansion is PTX (a few bit operations, an f16x2 multiply and two conversions per pair of weights): the
same in portable Triton measured compute-bound at 2.4x its time (H100).
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting, nvidia_capability, platform_of, run_kernel
from atomlite.model_ops.triton.mxfp4.quant import e2m1_to_float_wide, pow2, quantize_blocks
from atomlite.model_ops.triton.mxfp4.slabs import matmul_by_slabs
from atomlite.model_ops.triton.mxfp4.tuning import (BLOCKWISE_EXPAND_ROWS, BLOCKWISE_EXPAND_WARPS,
                                                    BLOCKWISE_QUANTIZE_ROWS, BLOCKWISE_QUANTIZE_WARPS)

GROUP = 128  # K per block scale of the GEMM
STEP_K = 256  # K per program of the kernels below; weights are padded to a multiple of it at load time
STEP = tl.constexpr(STEP_K)  # for use inside the kernels
FOLD_SHIFT = tl.constexpr(6)  # the group's largest block lands at e2m1 * 2^6: up to 384, under e4m3's 448


@dataclass(frozen=True, slots=True)
class BlockwiseConfig:
    rows: int  # weight rows per slab


def has_block_scaling(device: torch.device) -> bool:
    """An NVIDIA sm_90 GPU with torch's scaled_mm block scaling (cuBLAS's 1x128 block scaling is Hopper's)."""
    return nvidia_capability(device) == (9, 0) and hasattr(torch.nn.functional, "ScalingType")


def supported(x: torch.Tensor, n: int) -> bool:
    """bf16 activations on a GPU with block scaling (has_block_scaling), and N a multiple of 16 (cuBLAS's fp8
    operands)."""
    return x.dtype == torch.bfloat16 and n % 16 == 0 and has_block_scaling(x.device)


@triton.jit
def _group_top(exponents, ROWS: tl.constexpr):
    """Block exponents [ROWS, 8] (one 256-K step) -> per block [ROWS, 2, 4] and their groups' largest [ROWS, 2]."""
    blocks = tl.reshape(exponents, (ROWS, 2, 4))
    return blocks, tl.max(blocks, axis=2)


@triton.jit
def _store_factors(factors, group_top_biased, step, rows, row_mask, count):
    """2^(group's largest - 6) [ROWS, 2] of this 256-K step into factors [K'/128, count] (the GEMM's scale layout:
    rows contiguous)."""
    group = step * 2 + tl.arange(0, 2)
    tl.store(factors + group[None, :] * count + rows[:, None], pow2(group_top_biased - 6), mask=row_mask[:, None])


@triton.jit
def _quantize_kernel(x, xq, factors, M, M_OUT, K, stride_xm, stride_qm, BLOCK_M: tl.constexpr):
    """x [M, K] -> its MXFP4 quantization folded per 128-K group into e4m3 xq [M_OUT, K'] (zeros past M and K)
    and the groups' factors into factors [K'/128, M_OUT]."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * STEP + tl.arange(0, STEP)
    tile = tl.load(x + rm[:, None] * stride_xm + rk[None, :], mask=(rm < M)[:, None] & (rk < K)[None, :], other=0.0)
    q, exponent = quantize_blocks(tile.to(tl.float32), BLOCK_M, STEP)
    blocks, top = _group_top(exponent, BLOCK_M)
    fold = pow2(blocks - top[:, :, None] + 127 + FOLD_SHIFT)
    folded = tl.reshape(tl.reshape(q, (BLOCK_M, 2, 4, 32)) * fold[:, :, :, None], (BLOCK_M, STEP))
    tl.store(xq + rm[:, None] * stride_qm + rk[None, :], folded.to(tl.float8e4nv), mask=(rm < M_OUT)[:, None])
    _store_factors(factors, top + 127, tl.program_id(1), rm, rm < M_OUT, M_OUT)


# One word of codes (elements 2i in the low nibble, 2i + 1 in the high nibble of byte i) and a block factor
# 2^(d + 12) as f16x2 -> the e4m3 bytes of elements 0..3 ($0) and 4..7 ($1) times 2^(d + 6). The codes' bits moved
# into e4m3's give each value times 2^-6 exactly (code 1 as a subnormal); the factor is applied in f16, exact, then
# rounded to e4m3.
def _times_factor_ptx(word: str, out: str) -> str:
    """PTX: four e4m3 bytes of `word` times the f16x2 factor $3, rounded back to e4m3, into `out`."""
    return f"""mov.b32 {{p, q}}, {word};
cvt.rn.f16x2.e4m3x2 h0, p;
cvt.rn.f16x2.e4m3x2 h1, q;
mul.rn.f16x2 h0, h0, $3;
mul.rn.f16x2 h1, h1, $3;
cvt.rn.satfinite.e4m3x2.f16x2 p, h0;
cvt.rn.satfinite.e4m3x2.f16x2 q, h1;
mov.b32 {out}, {{p, q}};
"""


_E2M1X8_TO_SCALED_E4M3_PTX = tl.constexpr("""
{
.reg .b32 lo, hi, a, b, h0, h1;
.reg .b16 p, q;
shl.b32 a, $2, 4;
and.b32 a, a, 0x80808080;
shl.b32 b, $2, 2;
and.b32 b, b, 0x1C1C1C1C;
or.b32 lo, a, b;
and.b32 a, $2, 0x80808080;
shr.u32 b, $2, 2;
and.b32 b, b, 0x1C1C1C1C;
or.b32 hi, a, b;
prmt.b32 a, lo, hi, 0x5140;
prmt.b32 b, lo, hi, 0x7362;
""" + _times_factor_ptx("a", "$0") + _times_factor_ptx("b", "$1") + "}")


@triton.jit
def _expand_kernel(w, w_scale, wq, factors, N, stride_wn, stride_sn, stride_qn, PTX: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Weight rows [N, K'/2] packed + [N, K'/32] scale bytes -> e4m3 wq [N, K'] folded per 128-K group, factors
    [K'/128, N]. Consecutive programs take consecutive K steps of the same rows."""
    step = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_safe = rn % N  # rows past the end re-read a valid row: no load mask; they are not stored
    scale = tl.load(w_scale + rn_safe[:, None] * stride_sn + step * 8 + tl.arange(0, 8)[None, :]).to(tl.int32)
    blocks, top = _group_top(scale, BLOCK_N)
    d = tl.reshape(blocks - top[:, :, None], (BLOCK_N, 8, 1))  # <= 0: binades under the group's largest
    if PTX:
        words = tl.load(w + rn_safe[:, None] * stride_wn + step * (STEP // 8) + tl.arange(0, STEP // 8)[None, :])
        # 2^(d + 12) in f16 bits, twice; 0 where even the largest code would round to 0 in e4m3
        half = tl.where(d > -27, (d + 27) << 10, 0)
        factor = tl.broadcast_to(half | (half << 16), (BLOCK_N, 8, 4))
        first, second = tl.inline_asm_elementwise(_E2M1X8_TO_SCALED_E4M3_PTX, "=r,=r,r,r",
                                                  [tl.reshape(words, (BLOCK_N, 8, 4)), factor],
                                                  dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        values = tl.reshape(tl.join(first, second), (BLOCK_N, STEP // 4))  # words of 4 e4m3 bytes, in K order
        tl.store(wq + rn[:, None] * stride_qn + step * (STEP // 4) + tl.arange(0, STEP // 4)[None, :], values,
                 mask=(rn < N)[:, None])
    else:
        packed = tl.load(w + rn_safe[:, None] * stride_wn + step * (STEP // 2) + tl.arange(0, STEP // 2)[None, :])
        codes = tl.reshape(packed.to(tl.int32), (BLOCK_N, 8, 16))
        # e2m1_to_float_wide's scale byte: value * 2^(byte - 127) = value * 2^(d + 6). Below byte 2 (blocks over
        # 130 binades under their group's largest) it stays 2^-125 * value, which e4m3 rounds to 0 all the same.
        low = e2m1_to_float_wide(codes & 15, d + 127 + FOLD_SHIFT, True)
        high = e2m1_to_float_wide(codes >> 4, d + 127 + FOLD_SHIFT, True)
        values = tl.reshape(tl.join(low, high), (BLOCK_N, STEP))  # byte j holds elements 2j (low), 2j + 1 (high)
        tl.store(wq + rn[:, None] * stride_qn + step * STEP + tl.arange(0, STEP)[None, :], values.to(tl.float8e4nv),
                 mask=(rn < N)[:, None])
    _store_factors(factors, top, step, rn, rn < N, N)


# cuBLAS's block-scaled fp8 GEMM refuses some row counts (CUBLAS_STATUS_NOT_SUPPORTED in mixed steps of 31B MXFP4):
# the activations are quantized into rows padded to a multiple of 16, the padding's results dropped
ROWS_ALIGN = 16


def quantize_activations(x: torch.Tensor, k_padded: int, m_out: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M', K'], fp32 factors [M', K'/128] with unit stride along M'), as scaled_mm takes them;
    rows M..M' (m_out, default M) are zeros."""
    m, k = x.shape
    m_out = m if m_out is None else m_out
    xq = torch.empty((m_out, k_padded), dtype=torch.float8_e4m3fn, device=x.device)
    factors = torch.empty((k_padded // GROUP, m_out), dtype=torch.float32, device=x.device)
    run_kernel(_quantize_kernel, (triton.cdiv(m_out, BLOCKWISE_QUANTIZE_ROWS), k_padded // STEP_K),
        x, xq, factors, m, m_out, k, x.stride(0), xq.stride(0), BLOCK_M=BLOCKWISE_QUANTIZE_ROWS,
        num_warps=BLOCKWISE_QUANTIZE_WARPS)
    return xq, factors.T


def _factor_rows(flat: torch.Tensor, n: int, k_padded: int) -> torch.Tensor:
    """The first N * K'/128 of a flat fp32 buffer as factors [N, K'/128] with unit stride along N."""
    return flat[:n * (k_padded // GROUP)].view(k_padded // GROUP, n).T


def expand_weight(weight: torch.Tensor, weight_scale: torch.Tensor, wq: torch.Tensor,
                  factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K'/2] -> e4m3 into wq [N, K'] and fp32 factors into the first N * K'/128 of the flat factors;
    returns (wq, factors [N, K'/128] with unit stride along N)."""
    n, k_padded = weight.shape[0], weight.shape[1] * 2
    factors = _factor_rows(factors, n, k_padded)
    ptx = platform_of(wq.device).kind == "cuda" and not interpreting()
    run_kernel(_expand_kernel, (k_padded // STEP_K, triton.cdiv(n, BLOCKWISE_EXPAND_ROWS)),
        weight.view(torch.int32) if ptx else weight, weight_scale, wq.view(torch.int32) if ptx else wq, factors, n,
        weight.stride(0) // 4 if ptx else weight.stride(0), weight_scale.stride(0),
        wq.stride(0) // 4 if ptx else wq.stride(0), PTX=ptx, BLOCK_N=BLOCKWISE_EXPAND_ROWS,
        num_warps=BLOCKWISE_EXPAND_WARPS)
    return wq[:n], factors


def blockwise_scaled_mm(xq: torch.Tensor, x_factors: torch.Tensor, wq: torch.Tensor, w_factors: torch.Tensor,
                        out: torch.Tensor) -> None:
    """out = (xq * x_factors per 128-K group) @ (wq * w_factors per 128-K group)^T, by cuBLAS."""
    blockwise = [torch.nn.functional.ScalingType.BlockWise1x128.value]
    torch.ops.aten._scaled_mm_v2.out(xq, wq.T, [x_factors], blockwise, [], [w_factors], blockwise, [], None,
                                     out.dtype, out=out)


def mxfp4_gemm_blockwise(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         config: BlockwiseConfig) -> torch.Tensor:
    """MXFP4-quantized bf16 x [M, K] @ W^T -> bf16 [M, N], where supported(x, N). weight [N, K'/2] and weight_scale
    [N, K'/32] with K' a multiple of 256 (mxfp4_gemm.pad_to_k_align)."""
    m = x.shape[0]
    n, k_padded = weight.shape[0], weight.shape[1] * 2

    def allocate(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty((rows, k_padded), dtype=torch.float8_e4m3fn, device=x.device),
                torch.empty(rows * (k_padded // GROUP), dtype=torch.float32, device=x.device))

    def launch(slab: tuple[torch.Tensor, torch.Tensor], first: int, count: int) -> None:
        expand_weight(weight[first:first + count], weight_scale[first:first + count], *slab)

    def multiply(quantized, slab, count: int, out_view: torch.Tensor) -> None:
        wq, factors = slab
        blockwise_scaled_mm(*quantized, wq[:count], _factor_rows(factors, count, k_padded), out_view)

    m_padded = -(-m // ROWS_ALIGN) * ROWS_ALIGN
    out = torch.empty((m_padded, n), dtype=x.dtype, device=x.device)
    matmul_by_slabs(x, n, config.rows, allocate, launch, lambda: quantize_activations(x, k_padded, m_padded),
                    multiply, out)
    return out[:m]
