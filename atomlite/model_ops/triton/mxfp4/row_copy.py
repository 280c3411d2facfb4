"""MXFP4 GEMMs of many rows at fp8 tensor-core rate, on an e4m3 copy of the weight made once at load.

Expanding the packed weight on every call (blockwise.py's slabs) costs a pass over the whole weight, about as long as
the GEMM itself at 128-512 rows; without an expansion the rows would run the bf16-expanding kernel. So where the
copy is made (mxfp4_linear.make_row_copies), a weight row's blocks are folded into e4m3 values once, with one fp32
factor per row: each block's e2m1 values times 2^(its exponent - the row's largest + 6), and the factor 2^(the row's
largest exponent - 6). Activations are folded the same way per token on every call. The GEMM is then the FP8
checkpoints' per-token x per-channel one (fp8.gemm.gemm_on_rows: Triton row tiles, or cuBLAS beyond them).

e2m1 values have one mantissa bit and e4m3's subnormals reach 2^-9, so a block within 14 binades of its row's
largest is exact. A weight is copied only where every nonzero block is (checked at load); an activation block further
below its token's largest rounds to e4m3 (each element off by at most 2^-10 of the factor, against 256 to 384 for the
token's largest values), and a token whose largest block exponent is under -120 comes out as zeros.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.platform import Platform
from atomlite.model_ops.triton.common import capability_of, dependent_launches, gdc_wait, pdl_launch, run_kernel
from atomlite.model_ops.triton.fp8.gemm import gemm_on_rows, library_takes_row_scales
from atomlite.model_ops.triton.fp8.quant import chunk_amaxes, round_e4m3
from atomlite.model_ops.triton.mxfp4.blockwise import FOLD_SHIFT, STEP, STEP_K
from atomlite.model_ops.triton.mxfp4.quant import block_exponent, pow2, quantize_blocks
from atomlite.model_ops.triton.mxfp4.tuning import ROW_COPY_FOLD_ROWS, ROW_COPY_FOLD_WARPS, ROW_COPY_MIN_M
from atomlite.quant import mxfp4

EXACT_BINADES = 14  # a block this many binades under its row's largest still folds exactly (2^-8 * 0.5 = 2^-9)
SMALLEST_TOP = 7  # a row whose largest scale byte is under this would need a factor under 2^-126
LOAD_CHUNK_VALUES = 2 ** 25  # weight values folded at a time at load (their codes, exponents and fp32 values)


@dataclass(frozen=True, slots=True, eq=False)
class RowCopy:
    """A weight folded per row: e4m3 values [N, K'] and fp32 factors [N, 1]."""
    weight: torch.Tensor
    factors: torch.Tensor


def supported(platform: Platform) -> bool:
    """fp8 e4m3 tensor cores on NVIDIA (sm_89 and newer); the copy's GEMMs were measured on an H200."""
    return capability_of(platform) >= (8, 9)


def copy_bytes(n: int, k_padded: int) -> int:
    """What the copy of an [N, K'] weight takes: one byte a value and a factor a row."""
    return n * (k_padded + 4)


def runs_copy(m: int) -> bool:
    return m >= ROW_COPY_MIN_M


def make_row_copy(weight: torch.Tensor, weight_scale: torch.Tensor) -> RowCopy | None:
    """The copy of a packed weight [N, K'/2] with e8m0 scales [N, K'/32] (K' a multiple of 256), or None where a
    nonzero block sits more than EXACT_BINADES under its row's largest (or a row's largest is under SMALLEST_TOP, or
    a scale is the NaN byte 255). On the meta device (the compile gate's recording) the copy's shapes alone."""
    n, k_padded = weight.shape[0], weight.shape[1] * 2
    if weight.device.type == "meta":
        return RowCopy(torch.empty(n, k_padded, dtype=torch.float8_e4m3fn, device=weight.device),
                       torch.empty(n, 1, dtype=torch.float32, device=weight.device))
    if weight.is_cuda:
        library_takes_row_scales(weight.device, torch.float8_e4m3fn)  # asked now, before any graph capture
    values = torch.empty(n, k_padded, dtype=torch.float8_e4m3fn, device=weight.device)
    factors = torch.empty(n, 1, dtype=torch.float32, device=weight.device)
    rows = max(1, LOAD_CHUNK_VALUES // k_padded)
    for first in range(0, n, rows):
        part = slice(first, first + rows)
        folded = _fold_weight_rows(weight[part], weight_scale[part])
        if folded is None:
            return None
        values[part], factors[part] = folded
    return RowCopy(values, factors)


def _fold_weight_rows(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    codes = mxfp4.unpack_e2m1(weight)
    blocks = codes.reshape(codes.shape[0], -1, mxfp4.BLOCK)
    nonzero = ((blocks & 7) != 0).any(dim=-1)  # [rows, K'/32]: blocks whose scale matters
    scale = weight_scale.to(torch.int32)
    top = torch.where(nonzero, scale, -1).amax(dim=1, keepdim=True)
    top = torch.where(top < 0, mxfp4.E8M0_BIAS, top)  # an all-zero row: any factor
    too_far = nonzero & (scale < top - EXACT_BINADES)
    if too_far.any() or (nonzero & (scale == 255)).any() or (top < SMALLEST_TOP).any():
        return None
    shift = torch.where(nonzero, scale - top + FOLD_SHIFT.value, 0).to(torch.float32)
    folded = mxfp4.e2m1_decode(blocks) * torch.exp2(shift)[..., None]
    factors = torch.exp2((top - mxfp4.E8M0_BIAS - FOLD_SHIFT.value).to(torch.float32))
    return folded.reshape(codes.shape).to(torch.float8_e4m3fn), factors


@triton.jit
def _fold_rows_kernel(x, amaxes, xq, factors, M, K, CHUNKS, stride_xm, stride_am, stride_qm,
                      BLOCK_M: tl.constexpr, CHUNKS_P: tl.constexpr, PDL: tl.constexpr = False):
    """x [M, K] -> its MXFP4 quantization folded per row into e4m3 xq [M, K'] (zeros past K) and the rows' factors
    [M, 1]; amaxes [M, CHUNKS]: each row's amax per chunk (fp8.quant.chunk_amaxes), whose largest gives the row's
    largest block exponent. Program (rows, 256-K step). PDL: a dependent launch of the chunks' kernel."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * STEP + tl.arange(0, STEP)
    row_ok = rm < M
    chunks = tl.arange(0, CHUNKS_P)
    if PDL:
        gdc_wait()
    row_amax = tl.max(tl.load(amaxes + rm[:, None] * stride_am + chunks[None, :],
                              mask=row_ok[:, None] & (chunks < CHUNKS)[None, :], other=0.0), axis=1)
    top = block_exponent(row_amax)
    tile = tl.load(x + rm[:, None] * stride_xm + rk[None, :], mask=row_ok[:, None] & (rk < K)[None, :], other=0.0)
    q, exponent = quantize_blocks(tile.to(tl.float32), BLOCK_M, STEP)
    fold = pow2(exponent - top[:, None] + 127 + FOLD_SHIFT)
    folded = tl.reshape(tl.reshape(q, (BLOCK_M, STEP // 32, 32)) * fold[:, :, None], (BLOCK_M, STEP))
    tl.store(xq + rm[:, None] * stride_qm + rk[None, :], round_e4m3(folded).to(tl.float8e4nv), mask=row_ok[:, None])
    if tl.program_id(1) == 0:
        tl.store(factors + rm, pow2(top + 127 - FOLD_SHIFT), mask=row_ok)


def fold_activations(x: torch.Tensor, k_padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K'] , fp32 factors [M, 1]): its dynamic MXFP4 quantization folded per row."""
    m, k = x.shape
    pdl = dependent_launches(x.device)
    amaxes = chunk_amaxes(x, k, gated=False, pdl=pdl)
    xq = torch.empty((m, k_padded), dtype=torch.float8_e4m3fn, device=x.device)
    factors = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    run_kernel(_fold_rows_kernel, (triton.cdiv(m, ROW_COPY_FOLD_ROWS), k_padded // STEP_K),
               x, amaxes, xq, factors, m, k, amaxes.shape[1], x.stride(0), amaxes.stride(0), xq.stride(0),
               BLOCK_M=ROW_COPY_FOLD_ROWS, CHUNKS_P=triton.next_power_of_2(amaxes.shape[1]), PDL=pdl,
               num_warps=ROW_COPY_FOLD_WARPS, **pdl_launch(pdl))
    return xq, factors


def row_copy_gemm(x: torch.Tensor, copy: RowCopy) -> torch.Tensor:
    """MXFP4-quantized x [M, K] (bf16, unit last stride) @ W^T -> [M, N] in x's dtype, on the weight's copy."""
    xq, x_factors = fold_activations(x, copy.weight.shape[1])
    return gemm_on_rows(xq, x_factors, copy.weight, copy.factors, copy.weight.shape[1], x.dtype)
