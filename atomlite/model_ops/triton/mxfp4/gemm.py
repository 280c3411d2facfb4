"""y = x @ W^T with W in MXFP4 (packed e2m1 uint8 [N, K/2] + e8m0 uint8 [N, K/32]), read packed from memory.

mxfp4_gemm picks one of five paths (pick_path), the first three for MXFP4-quantized activations on NVIDIA GPUs:
- for 5 to 64 rows on sm_89+, one fp8 MMA per step on operands that carry their block scales (mxfp4_gemm_lookup),
  when the weight's scales fit it (scale_bytes_fit, at load time);
- on sm_89+, fp8 MMAs on scaled per-block sums (mxfp4_gemm_fp8) for up to 4 rows, and up to 64 for other weights;
- from 128 rows of bf16 on sm_90, cuBLAS's block-scaled fp8 GEMM on slabs of weight rows expanded to e4m3
  (mxfp4_gemm_blockwise);
- from 512 rows on other GPUs (or activations not quantized), slabs of weight rows expanded to x's dtype by
  _dequantize_kernel, each multiplied by the vendor GEMM: a pass over the packed weight per call is small next to
  the GEMM's M x N x K work;
- otherwise the kernel below. Each program expands its weight tile to bf16 (fp32 when interpreting or for fp32
  inputs) in registers, a few bit ops per weight; on NVIDIA as PTX working on two weights per 32-bit register
  (portable Triton elsewhere). The tile is computed transposed (acc[N, M] = W x^T): the expanded weight is the
  dot's register operand and x^T comes from memory. Decode tiles load the next weight tile while computing this
  one, and split K when N has too few tiles to keep every SM streaming. Dynamic MXFP4 activation quantization is a
  separate pass over x (inside the GEMM it is repeated for every N tile: measured slower).
"""
import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import InputQuantization, PartialSums
from atomlite.model_ops.triton.mxfp4 import blockwise as mxfp4_gemm_blockwise
from atomlite.model_ops.triton.mxfp4 import fp8_tiles as mxfp4_gemm_fp8
from atomlite.model_ops.triton.mxfp4 import lookup as mxfp4_gemm_lookup
from atomlite.model_ops.triton.common import interpreting, platform_of, run_kernel
from atomlite.model_ops.triton.mxfp4.blockwise import BlockwiseConfig
from atomlite.model_ops.triton.mxfp4.fp8_tiles import Fp8Config
from atomlite.model_ops.triton.mxfp4.lookup import LookupConfig
from atomlite.model_ops.triton.mxfp4.quant import e2m1_to_float_wide, quantize_dequantize
from atomlite.model_ops.triton.mxfp4.slabs import matmul_by_slabs
from atomlite.model_ops.triton.mxfp4.tuning import (BLOCKWISE_MIN_M, DECODE, DECODE_MAX_M, DECODE_MAX_SPLIT_K,
                                                    DECODE_PROGRAMS, DEQUANTIZE_BLOCK_N, DEQUANTIZE_MIN_M,
                                                    DEQUANTIZE_WARPS, FP8_MAX_M, LARGE_PREFILL, LONG_K,
                                                    LONG_K_SLAB_VALUES, LOOKUP_MIN_M, MIN_DECODE_TILES, PREFILL,
                                                    PREFILL_MAX_M, SHORT_K_SLAB_VALUES, SLAB_VALUES, GemmConfig)
from atomlite.quant import mxfp4

# Weights are padded along K to this at load time (zero bytes decode to 0), so the K loop needs no weight mask.
K_ALIGN = 256


def pick_config(m: int, n: int) -> GemmConfig:
    if m > DECODE_MAX_M:
        return PREFILL if m <= PREFILL_MAX_M else LARGE_PREFILL
    tiles = triton.cdiv(n, DECODE.block_n)
    if tiles >= MIN_DECODE_TILES:
        return DECODE
    return dataclasses.replace(DECODE, split_k=min(DECODE_MAX_SPLIT_K, triton.cdiv(DECODE_PROGRAMS, tiles)))


@triton.jit
def _e2m1_to_float(code, scale_byte, FP32: tl.constexpr):
    """Nibble codes [.., G, 16] and their blocks' e8m0 bytes [.., G, 1] -> e2m1 value * 2^(scale - 127).

    The code's 3 magnitude bits are placed at the top of the float's exponent field, which makes them the value
    times 2^-126 (code 1, 0.5, comes out subnormal, exactly); multiplying by 2^(scale - 1) is then exact. That
    factor must be a normal float: scale bytes up to 128 (scales up to 2, i.e. block amax under ~7).
    """
    if FP32:
        bits = ((code & 7) << 22) | ((code & 8) << 28)
        factor = ((scale_byte + 126) << 23).to(tl.float32, bitcast=True)
        value = bits.to(tl.float32, bitcast=True) * factor
    else:
        bits = ((code & 7) << 6) | ((code & 8) << 12)
        factor = ((scale_byte + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
        value = bits.to(tl.int16).to(tl.bfloat16, bitcast=True) * factor
    return value


# Four bytes (eight codes) and their four scale bytes -> low-nibble values (2 x bf16x2) and high-nibble values.
# Bytes go to the two 16-bit halves (prmt); magnitude bits to the top of the exponent field, sign to bit 15, which
# is the value times 2^-126; one bf16x2 multiply by 2^(scale - 1) per pair then gives value * 2^(scale - 127).
_E2M1X8_TO_BF16_PTX = tl.constexpr("""
{
.reg .b32 z, t0, t1, f0, f1, a, b;
mov.b32 z, 0;
prmt.b32 t0, $4, z, 0x4140;
prmt.b32 t1, $4, z, 0x4342;
prmt.b32 f0, $5, z, 0x4140;
prmt.b32 f1, $5, z, 0x4342;
add.u32 f0, f0, 0x007E007E;
shl.b32 f0, f0, 7;
add.u32 f1, f1, 0x007E007E;
shl.b32 f1, f1, 7;
shl.b32 a, t0, 6;
and.b32 a, a, 0x01C001C0;
shl.b32 b, t0, 12;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $0, a, f0;
shl.b32 a, t1, 6;
and.b32 a, a, 0x01C001C0;
shl.b32 b, t1, 12;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $1, a, f1;
shl.b32 a, t0, 2;
and.b32 a, a, 0x01C001C0;
shl.b32 b, t0, 8;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $2, a, f0;
shl.b32 a, t1, 2;
and.b32 a, a, 0x01C001C0;
shl.b32 b, t1, 8;
and.b32 b, b, 0x80008000;
or.b32 a, a, b;
mul.rn.bf16x2 $3, a, f1;
}
""")


@triton.jit
def _expand_ptx(packed, scale_byte):
    """uint8 bytes [.., G, 16] and uint8 scales [.., G, 1] -> bf16 (low-nibble values, high-nibble values)."""
    scales = tl.broadcast_to(scale_byte, packed.shape)
    return tl.inline_asm_elementwise(_E2M1X8_TO_BF16_PTX, "=r,=r,=r,=r,r,r", [packed, scales],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _expand_tile(packed, scale_byte, FP32: tl.constexpr, WIDE_SCALES: tl.constexpr, PTX: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Packed bytes [BLOCK_N, BLOCK_K/2] and scale bytes [BLOCK_N, BLOCK_K/32] -> values [BLOCK_N, BLOCK_K]."""
    packed = tl.reshape(packed, (BLOCK_N, BLOCK_K // 32, 16))
    scale_byte = tl.reshape(scale_byte, (BLOCK_N, BLOCK_K // 32, 1))
    if PTX:
        low, high = _expand_ptx(packed, scale_byte)
    elif WIDE_SCALES:
        low = e2m1_to_float_wide(packed.to(tl.int32) & 15, scale_byte.to(tl.int32), FP32)
        high = e2m1_to_float_wide(packed.to(tl.int32) >> 4, scale_byte.to(tl.int32), FP32)
    else:
        low = _e2m1_to_float(packed.to(tl.int32) & 15, scale_byte.to(tl.int32), FP32)
        high = _e2m1_to_float(packed.to(tl.int32) >> 4, scale_byte.to(tl.int32), FP32)
    return tl.reshape(tl.join(low, high), (BLOCK_N, BLOCK_K))


@triton.jit
def _mxfp4_gemm_kernel(x, w, w_scale, out, M, N, K, K_SPLIT, K_END, stride_xm, stride_wn, stride_sn, stride_om,
                       FP32: tl.constexpr, EVEN_K: tl.constexpr, WIDE_SCALES: tl.constexpr, PTX: tl.constexpr,
                       SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_N: tl.constexpr):
    # Programs that share an x tile run close together (L2 reuse of x and of W across neighbouring N tiles).
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_size = GROUP_N * tiles_m
    first_n = (pid // group_size) * GROUP_N
    group_n = tl.minimum(tiles_n - first_n, GROUP_N)
    pid_n = first_n + (pid % group_size) % group_n
    pid_m = (pid % group_size) // group_n
    k_first = tl.program_id(1) * K_SPLIT

    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn_safe = rn % N  # out-of-range rows re-read a valid row: no load mask; their results are not stored
    rm_safe = rm % M
    w_rows = w + rn_safe[:, None] * stride_wn + tl.arange(0, BLOCK_K // 2)[None, :]
    s_rows = w_scale + rn_safe[:, None] * stride_sn + tl.arange(0, BLOCK_K // 32)[None, :]
    kk = tl.arange(0, BLOCK_K)
    x_rows = x + rm_safe[:, None] * stride_xm + kk[None, :]

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_end = tl.minimum(k_first + K_SPLIT, K_END)
    # PREFETCH loads the next weight tile into registers while this one is expanded and multiplied; without it
    # Triton's pipeliner stages the loads through shared memory, which measured slower for small M.
    packed = tl.load(w_rows + k_first // 2)
    scale_byte = tl.load(s_rows + k_first // 32)
    for k0 in range(k_first, k_end, BLOCK_K):
        if PREFETCH:
            k_next = tl.minimum(k0 + BLOCK_K, k_end - BLOCK_K)  # the last iteration re-reads its own tile
            packed_next = tl.load(w_rows + k_next // 2)
            scale_next = tl.load(s_rows + k_next // 32)
        else:
            packed = tl.load(w_rows + k0 // 2)
            scale_byte = tl.load(s_rows + k0 // 32)
        if EVEN_K:
            x_tile = tl.load(x_rows + k0)
        else:
            x_tile = tl.load(x_rows + k0, mask=(k0 + kk < K)[None, :], other=0.0)
        w_tile = _expand_tile(packed, scale_byte, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K)
        acc = tl.dot(w_tile, tl.trans(x_tile.to(w_tile.dtype)), acc, input_precision=DOT_PRECISION)
        if PREFETCH:
            packed, scale_byte = packed_next, scale_next

    out_ptrs = out + rm[None, :] * stride_om + rn[:, None]
    mask = (rm < M)[None, :] & (rn < N)[:, None]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")


# _e2m1_to_float's fast path holds for scale bytes up to this; weights with larger scales take the wide path.
FAST_MAX_SCALE_BYTE = 128


def pad_to_k_align(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Load-time layout for mxfp4_gemm: K padded to a multiple of K_ALIGN, rows contiguous."""
    return mxfp4.pad_k(weight, weight_scale, K_ALIGN)


def needs_wide_scales(weight_scale: torch.Tensor) -> bool:
    """Load-time check (it syncs): does this weight need the slower exact expansion for scales above 2?"""
    return bool(weight_scale.numel()) and int(weight_scale.max()) > FAST_MAX_SCALE_BYTE


@triton.jit
def _dequantize_kernel(w, w_scale, out, N, stride_wn, stride_sn, stride_on, FP32: tl.constexpr,
                       WIDE_SCALES: tl.constexpr, PTX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rn_safe = rn % N
    packed = tl.load(w + rn_safe[:, None] * stride_wn + k0 // 2 + tl.arange(0, BLOCK_K // 2)[None, :])
    scale_byte = tl.load(w_scale + rn_safe[:, None] * stride_sn + k0 // 32 + tl.arange(0, BLOCK_K // 32)[None, :])
    tile = _expand_tile(packed, scale_byte, FP32, WIDE_SCALES, PTX, BLOCK_N, BLOCK_K)
    tl.store(out + rn[:, None] * stride_on + k0 + tl.arange(0, BLOCK_K)[None, :], tile, mask=(rn < N)[:, None])


def _expansion_mode(x: torch.Tensor, wide_scales: bool) -> tuple[bool, bool]:
    """(FP32, PTX) for _expand_tile: fp32 values for fp32 inputs and under the interpreter (bf16 arithmetic is
    wrong there); the PTX expansion on NVIDIA when every scale takes the fast path."""
    fp32 = x.dtype == torch.float32 or interpreting()
    return fp32, not fp32 and not wide_scales and platform_of(x.device).kind == "cuda"


@dataclass(frozen=True, slots=True)
class DequantizeConfig:
    """Large M: expand `rows` weight rows at a time to x's dtype, then the vendor GEMM (cuBLAS / hipBLASLt).
    On a GPU the next slab is expanded on a side stream while the GEMM of this one runs (two slab buffers), and
    the first one while x is quantized: the expansion is a memory-bound pass, the GEMM compute-bound."""
    rows: int


def _slab_rows(k: int, values: int) -> int:
    """Weight rows per slab of about `values` values at K = k: a multiple of 256, at least 256."""
    return max(256, values // k // 256 * 256)


def dequantize_config(k: int) -> DequantizeConfig:
    return DequantizeConfig(rows=_slab_rows(k, SLAB_VALUES))


def blockwise_config(k: int) -> BlockwiseConfig:
    return BlockwiseConfig(rows=_slab_rows(k, LONG_K_SLAB_VALUES if k > LONG_K else SHORT_K_SLAB_VALUES))


def _dequantized_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, quantize_x: bool,
                        wide_scales: bool, rows: int) -> torch.Tensor:
    m, k = x.shape
    n = weight.shape[0]
    fp32, ptx = _expansion_mode(x, wide_scales)

    def allocate(slab_rows: int) -> torch.Tensor:
        return torch.empty((slab_rows, weight.shape[1] * 2), dtype=x.dtype, device=x.device)

    def launch(slab: torch.Tensor, first: int, count: int) -> None:
        block_n, block_k = DEQUANTIZE_BLOCK_N, K_ALIGN
        run_kernel(_dequantize_kernel, (triton.cdiv(count, block_n), slab.shape[1] // block_k),
            weight[first:], weight_scale[first:], slab, count, weight.stride(0), weight_scale.stride(0),
            slab.stride(0), FP32=fp32, WIDE_SCALES=wide_scales, PTX=ptx, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=DEQUANTIZE_WARPS)

    def multiply(x_ready: torch.Tensor, slab: torch.Tensor, count: int, out_view: torch.Tensor) -> None:
        torch.matmul(x_ready, slab[:count, :k].T, out=out_view)

    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    return matmul_by_slabs(x, n, rows, allocate, launch, lambda: quantize_dequantize(x) if quantize_x else x,
                           multiply, out)


Config = GemmConfig | Fp8Config | LookupConfig | DequantizeConfig | BlockwiseConfig


def pick_path(m: int, n: int, x: torch.Tensor, quantize_x: bool, wide_scales: bool = True,
              lookup_scales: bool = False, k: int | None = None) -> Config:
    """The kernel and tile config for this call: for small M where x is MXFP4-quantized and fp8 MMAs exist, the
    lookup kernel (5-64 rows, lookup_scales) or the fp8 tiles; for large M the block-scaled fp8 GEMM (quantized
    bf16 x on sm_90) or the vendor GEMM on bf16 slabs; the bf16-expanding kernel otherwise. k: the GEMM's K where x
    is wider (a gated [gate | up]); x's width by default."""
    if quantize_x and m <= FP8_MAX_M and mxfp4_gemm_fp8.supported(x):
        if m >= LOOKUP_MIN_M and lookup_scales:
            return mxfp4_gemm_lookup.pick_config(m, n)
        return mxfp4_gemm_fp8.pick_config(m, n, triton.cdiv(k or x.shape[1], K_ALIGN) * K_ALIGN)
    if m >= BLOCKWISE_MIN_M and quantize_x and mxfp4_gemm_blockwise.supported(x, n):
        return blockwise_config(x.shape[1])
    if m >= DEQUANTIZE_MIN_M and platform_of(x.device).is_gpu:
        return dequantize_config(x.shape[1])
    return pick_config(m, n)


def input_quantization(m: int, weight: torch.Tensor, x: torch.Tensor, quantize_x: bool,
                       lookup_scales: bool = False) -> InputQuantization | None:
    """Where this call (m rows of x-like activations, a pad_to_k_align weight) runs the fp8 tiles: the form in which
    the kernel computing x may write it quantized (QuantizedRows, for quantized_fp8_gemm); else None."""
    config = pick_path(m, weight.shape[0], x, quantize_x, lookup_scales=lookup_scales, k=weight.shape[1] * 2)
    return InputQuantization(config.period, weight.shape[1] * 2) if isinstance(config, Fp8Config) else None


def gated_path(m: int, n: int, x: torch.Tensor, quantize_x: bool, lookup_scales: bool = False) -> bool:
    """Whether mxfp4_gemm(..., gated=True) runs for these rows: the paths whose activation quantization can apply
    gelu_tanh(gate) * up as it reads x (fp8 and lookup tiles)."""
    return isinstance(pick_path(m, n, x, quantize_x, lookup_scales=lookup_scales), (Fp8Config, LookupConfig))


def mxfp4_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, quantize_x: bool,
               wide_scales: bool = True, config: Config | None = None, lookup_scales: bool = False,
               gated: bool = False, summed: bool = True) -> torch.Tensor | PartialSums:
    """x [M, K] (bf16 or fp32, unit last stride) @ W^T -> [M, N] in x's dtype.

    weight [N, K'/2] / weight_scale [N, K'/32] come from pad_to_k_align; wide_scales=needs_wide_scales(weight_scale)
    and lookup_scales=scale_bytes_fit(weight, weight_scale) (the defaults are always right, the other values
    faster). quantize_x applies dynamic MXFP4 activation quantization first. config (default pick_path) also picks
    the kernel: Fp8Config and LookupConfig need quantize_x, LookupConfig also lookup_scales. gated: x is
    [gate | up] [M, 2K] and the GEMM multiplies gelu_tanh(gate) * up, computed by those two paths' activation
    quantization (gated_path says whether they run). summed=False: on those two paths a split-K output may come
    back as PartialSums, for a consumer that adds the slices.
    """
    m, k = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    out_features = weight.shape[0]
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"mxfp4_gemm takes bf16 or fp32 activations, got {x.dtype}")
    if m == 0:
        return torch.empty((m, out_features), dtype=x.dtype, device=x.device)
    k_padded = weight.shape[1] * 2
    if k_padded % K_ALIGN or k_padded < k:
        raise ValueError(f"weight K {k_padded} must cover x's K {k} and be a multiple of {K_ALIGN}: "
                         f"prepare weights with pad_to_k_align")
    config = config or pick_path(m, out_features, x, quantize_x, wide_scales, lookup_scales, k)
    if isinstance(config, (Fp8Config, LookupConfig)) and not quantize_x:
        raise ValueError(f"{type(config).__name__} kernels multiply MXFP4-quantized activations: "
                         "quantize_x must be True")
    if gated and not isinstance(config, (Fp8Config, LookupConfig)):
        raise ValueError(f"gated MXFP4 GEMMs run on the fp8 and lookup paths only, not {type(config).__name__}: "
                         "check gated_path first")
    if isinstance(config, Fp8Config):
        return mxfp4_gemm_fp8.mxfp4_gemm_fp8(x, weight, weight_scale, config, gated, summed)
    if isinstance(config, LookupConfig):
        if not lookup_scales:
            fit = mxfp4_gemm_lookup.LOOKUP_SCALE_BYTES
            raise ValueError(f"the lookup kernel takes weights whose nonzero blocks have scale bytes {fit.start} to "
                             f"{fit.stop - 1}: pass lookup_scales=scale_bytes_fit(weight, weight_scale)")
        return mxfp4_gemm_lookup.mxfp4_gemm_lookup(x, weight, weight_scale, config, gated, summed)
    if isinstance(config, BlockwiseConfig):
        if not (quantize_x and mxfp4_gemm_blockwise.supported(x, out_features)) or config.rows % 16:
            raise ValueError("BlockwiseConfig multiplies MXFP4-quantized bf16 activations on an NVIDIA sm_90 GPU, in "
                             "slabs of a multiple of 16 rows, for N a multiple of 16; got quantize_x="
                             f"{quantize_x}, {x.dtype} x on {x.device}, N={out_features}, rows={config.rows}")
        return mxfp4_gemm_blockwise.mxfp4_gemm_blockwise(x, weight, weight_scale, config)
    if isinstance(config, DequantizeConfig):
        return _dequantized_matmul(x, weight, weight_scale, quantize_x, wide_scales, config.rows)
    if quantize_x:
        x = quantize_dequantize(x)
    return _bf16_kernel(x, weight, weight_scale, wide_scales, config)


def _bf16_kernel(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, wide_scales: bool,
                 config: GemmConfig) -> torch.Tensor:
    m, k = x.shape
    out_features = weight.shape[0]
    fp32, ptx = _expansion_mode(x, wide_scales)
    k_loop = triton.cdiv(k, config.block_k)
    k_split = triton.cdiv(k_loop, config.split_k) * config.block_k
    split_k = triton.cdiv(k_loop * config.block_k, k_split)
    if split_k > 1:
        out = torch.zeros((m, out_features), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((m, out_features), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(out_features, config.block_n), split_k)
    run_kernel(_mxfp4_gemm_kernel, grid,
        x, weight, weight_scale, out, m, out_features, k, k_split, k_loop * config.block_k,
        x.stride(0), weight.stride(0), weight_scale.stride(0), out.stride(0), FP32=fp32,
        EVEN_K=k % config.block_k == 0, WIDE_SCALES=wide_scales, PTX=ptx, SPLIT_K=split_k,
        PREFETCH=config.prefetch, DOT_PRECISION="ieee" if fp32 else None,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_N=config.group_n,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return out.to(x.dtype)
