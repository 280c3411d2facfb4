"""The Triton MXFP4 GEMM and MXFP4Linear against the torch reference (on CPU under TRITON_INTERPRET=1)."""
import dataclasses

import pytest
import torch

from atomlite.model_ops.triton.mxfp4 import blockwise as mxfp4_gemm_blockwise

from atomlite.model_ops.triton.mxfp4 import fp8_tiles as mxfp4_gemm_fp8

from atomlite.model_ops.triton.mxfp4 import lookup as mxfp4_gemm_lookup
from atomlite.model_ops.triton.mxfp4 import tuning as mxfp4_tuning
from atomlite.model_ops.triton.mxfp4.gemm import (DECODE, LARGE_PREFILL, PREFILL, DequantizeConfig,
                                                  GemmConfig, blockwise_config, dequantize_config, mxfp4_gemm,
                                                  needs_wide_scales, pad_to_k_align, pick_config, pick_path)
from atomlite.model_ops.triton.mxfp4.fp8_tiles import Fp8Config
from atomlite.model_ops.triton.mxfp4.lookup import LookupConfig, scale_bytes_fit
from atomlite.quant import mxfp4
from atomlite.model_ops import dispatch
from atomlite.model_ops.fusion import link_feed
from atomlite.model_ops.mxfp4_linear import MXFP4Linear
from atomlite.model_ops.platform import detect_platform
from atomlite.quant.quark import LinearQuantSpec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_DECODE = GemmConfig(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=2)
SMALL_PREFILL = GemmConfig(block_m=32, block_n=32, block_k=64, num_warps=4, num_stages=2)
PREFETCH = GemmConfig(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=2, prefetch=True)
SPLIT_K = GemmConfig(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=2, split_k=3, prefetch=True)


def random_case(m: int, n: int, k: int, dtype: torch.dtype, seed: int, wide: bool = False):
    gen = torch.Generator().manual_seed(seed)
    # Blocks of very different magnitudes, so a scale applied to the wrong block shows; wide: scales above 2 too.
    exponents = torch.randint(-6, 7 if wide else 0, (n, k // 32), generator=gen).float()
    w = torch.randn(n, k, generator=gen) * torch.exp2(exponents).repeat_interleave(32, dim=1)
    x = torch.randn(m, k, generator=gen) * torch.exp2(torch.randint(-4, 4, (m, 1), generator=gen).float())
    packed, scale = mxfp4.quantize(w)
    return x.to(dtype), packed, scale


def reference(x, packed, scale, quantize_x: bool) -> torch.Tensor:
    xr = mxfp4.quantize_dequantize(x.float()) if quantize_x else x.float()
    return xr.double() @ mxfp4.dequantize(packed, scale).double().T


# A Hopper fp8 MMA sums the products of its K range with fewer mantissa bits than fp32 (measured up to 2e-4 of the
# output here); the lookup kernel sums 256 products per MMA. The interpreter's portable path is fp32.
FP8_SUMS_RTOL = 2 ** -11 if DEVICE == "cuda" else 1e-5


def assert_matches(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, fp32_rtol: float = 1e-5):
    assert got.dtype == dtype
    # fp32: summation order only. bf16: the output rounding (the interpreter truncates: up to 1 ulp).
    rtol = fp32_rtol if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(got.double().cpu(), expected, rtol=rtol, atol=rtol * expected.abs().max().item())


@pytest.mark.parametrize("m, n, k, config", [
    (1, 40, 96, SMALL_DECODE),      # N not a multiple of the tile, K not a multiple of block_k
    (7, 64, 256, SMALL_DECODE),
    (45, 72, 160, SMALL_PREFILL),
    (1, 40, 96, PREFETCH),          # the next weight tile loaded ahead; a masked K tail
    (2, 40, 320, PREFETCH),         # over five tiles
    (3, 40, 64, PREFETCH),          # a single tile
    (7, 64, 320, SPLIT_K),          # three K splits, the last one shorter
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quantize_x", [True, False])
@pytest.mark.parametrize("wide", [False, True])
def test_triton_gemm_matches_reference(m, n, k, config, dtype, quantize_x, wide):
    x, packed, scale = random_case(m, n, k, dtype, seed=m + n + k, wide=wide)
    assert needs_wide_scales(scale) == wide
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), quantize_x, wide, config)
    assert_matches(got, reference(x, packed, scale, quantize_x), dtype)


@pytest.mark.parametrize("m, n, k, config", [
    (1, 40, 96, Fp8Config(2, 64, 4, 2, period=8)),             # block-diagonal; K tail
    (2, 72, 544, Fp8Config(2, 64, 4, 2, split_k=2, period=8)),  # 3 K steps in 2 splits
    (3, 40, 512, Fp8Config(2, 64, 4, 2, period=8)),            # two block-diagonal row pairs
    (11, 72, 544, Fp8Config(8, 64, 4, 2, split_k=2, period=8)),  # block-diagonal tiles of 8 rows, 5 past the end
    (6, 40, 288, Fp8Config(16, 64, 4, 2, period=8)),           # one block-diagonal tile of 16 rows
    (5, 72, 288, Fp8Config(8, 64, 4, 2, period=2)),            # pair-diagonal, 3 padding rows
    (19, 40, 544, Fp8Config(16, 64, 4, 2, split_k=2, period=2)),  # two tiles of 16 rows, K split
    (5, 72, 544, Fp8Config(4, 64, 4, 2, period=4)),            # period 4: 2 MMAs per step, two tiles
    (9, 40, 288, Fp8Config(8, 64, 4, 2, split_k=2, period=4)),
    (5, 72, 288, Fp8Config(block_m=16, block_n=64, num_warps=4, num_stages=2)),  # one 32-K MMA per block
    (17, 40, 512, Fp8Config(block_m=16, block_n=64, num_warps=4, num_stages=2, split_k=2)),
    (3, 72, 544, Fp8Config(4, 64, 4, 2, split_k=2, period=8, tma=True)),   # weight tiles by TMA
    (19, 40, 544, Fp8Config(16, 64, 4, 2, period=2, tma=True)),
    (2, 200, 1056, dataclasses.replace(mxfp4_tuning.WIDE_DIAGONAL_2, split_k=3)),  # 128-row TMA tiles, 72 past N
    (7, 40, 96, DequantizeConfig(rows=32)),                                      # slabs of 32 weight rows
    (3, 72, 96, DequantizeConfig(rows=16)),                                      # 5 slabs: both buffers reused
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_and_dequantize_paths_match_reference(m, n, k, config, dtype):
    """Scales from 2^-6 to 2^6 on both sides, every K step and split in use: the fp8 products and the per-block
    scaling are exact, so fp32 agrees to summation order."""
    x, packed, scale = random_case(m, n, k, dtype, seed=m + n + k, wide=True)
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, True, config)
    assert_matches(got, reference(x, packed, scale, True), dtype)


@pytest.mark.parametrize("config", [Fp8Config(2, 64, 4, 2, split_k=2, period=8), LookupConfig(16, 64, 4, 2, split_k=2)])
def test_unsummed_split_k_output_adds_up_to_the_summed_one(config):
    """summed=False: the fp8 and lookup paths hand back their split-K slices, which add up (in slice order, as
    their summing kernel adds them) to exactly the summed output."""
    from atomlite.model_ops.carriers import PartialSums, summed
    from helpers import assert_same_rounded_sum
    x, packed, scale = random_case(3, 72, 544, torch.bfloat16, seed=5)
    weight, weight_scale = (t.to(DEVICE) for t in pad_to_k_align(packed, scale))
    args = (x.to(DEVICE), weight, weight_scale, True, True, config)
    lookup = dict(lookup_scales=isinstance(config, LookupConfig))
    unsummed = mxfp4_gemm(*args, summed=False, **lookup)
    assert isinstance(unsummed, PartialSums) and unsummed.parts.shape == (2, 3, 72)
    assert_same_rounded_sum(summed(unsummed), mxfp4_gemm(*args, **lookup))


@pytest.mark.parametrize("m, n, k, config", [
    (1, 40, 96, LookupConfig(16, 64, 4, 2)),              # K tail: one step, mostly padding
    (5, 72, 544, LookupConfig(32, 64, 4, 2, split_k=2)),  # 3 K steps in 2 splits, 27 rows past the end
    (19, 40, 288, LookupConfig(16, 64, 4, 2)),            # two row tiles
    (33, 72, 512, LookupConfig(64, 64, 4, 2, split_k=2)),
    (5, 72, 544, LookupConfig(16, 64, 4, 2, split_k=2, tma=False)),  # weight tiles through pointers
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lookup_path_matches_reference(m, n, k, config, dtype):
    """Scales from 2^-6 to 2^-1 on the weights, 2^-4 to 2^3 on x: both operands are exact in e5m2 with their
    scales, so fp32 agrees to summation order (to the fp8 MMA's sums on a GPU)."""
    x, packed, scale = random_case(m, n, k, dtype, seed=m + n + k)
    assert scale_bytes_fit(packed, scale)
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, False, config,
                     lookup_scales=True)
    assert_matches(got, reference(x, packed, scale, True), dtype, FP8_SUMS_RTOL)


def test_lookup_path_rounds_only_blocks_far_below_the_largest_of_their_step():
    """x blocks 2^-40 below the rest of their 256-K step round in e5m2: their products are far below the output's
    precision, so the result still matches; blocks 2^20 apart in one step (and a step 2^-60 below the others) are
    exact (to the fp8 MMA's sums on a GPU)."""
    x, packed, scale = random_case(3, 40, 768, torch.float32, seed=4)
    x[0, 32:64] *= 2.0 ** -40
    x[1, 64:96] *= 2.0 ** 20
    x[2, 256:512] *= 2.0 ** -60
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, False, mxfp4_gemm_lookup.ROWS_16,
                     lookup_scales=True)
    expected = reference(x, packed, scale, True)
    for row in range(3):
        assert_matches(got[row], expected[row], torch.float32, FP8_SUMS_RTOL)


def test_lookup_tables_hold_the_scaled_e2m1_magnitudes_for_the_scale_bytes_they_take():
    """The two table words the PTX builds from a scale byte (one add, one mask) are e5m2 bytes of the magnitudes
    times 2^(byte - 127 + 6) for every byte in LOOKUP_SCALE_BYTES, and not for the bytes just outside it."""
    magnitudes = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])

    def table(byte: int) -> torch.Tensor:
        t = ((byte - 127) * 0x04040404) % 2 ** 32
        low = ((t + mxfp4_gemm_lookup.LUT_LOW) % 2 ** 32) & 0xFFFFFF00
        high = (t + mxfp4_gemm_lookup.LUT_HIGH) % 2 ** 32
        raw = low.to_bytes(4, "little") + high.to_bytes(4, "little")
        return torch.tensor(list(raw), dtype=torch.uint8).view(torch.float8_e5m2).float()

    fit = mxfp4_gemm_lookup.LOOKUP_SCALE_BYTES
    for byte in fit:
        torch.testing.assert_close(table(byte), magnitudes * 2.0 ** (byte - 127 + mxfp4_gemm_lookup.WEIGHT_SHIFT),
                                   rtol=0, atol=0)
    for byte in (fit.start - 1, fit.stop):
        assert not torch.equal(table(byte), magnitudes * 2.0 ** (byte - 127 + mxfp4_gemm_lookup.WEIGHT_SHIFT))


def test_scale_bytes_fit_looks_only_at_blocks_with_nonzero_codes():
    _, packed, scale = random_case(1, 8, 128, torch.float32, seed=3)
    assert scale_bytes_fit(packed, scale)
    for byte in (mxfp4_gemm_lookup.LOOKUP_SCALE_BYTES.start - 1, mxfp4_gemm_lookup.LOOKUP_SCALE_BYTES.stop):
        out_of_range = scale.clone()
        out_of_range[2, 1] = byte
        assert not scale_bytes_fit(packed, out_of_range)
    zeros, zero_scale = packed.clone(), scale.clone()
    zeros[2, 16:32] = 0x88  # block 1 of row 2: codes +0 and -0
    zero_scale[2, 1] = 0
    assert scale_bytes_fit(zeros, zero_scale)
    assert scale_bytes_fit(torch.stack([zeros, packed]), torch.stack([zero_scale, scale]))  # experts [E, N, K/2]
    assert not scale_bytes_fit(torch.stack([packed, packed]), torch.stack([scale, zero_scale]))


def test_lookup_path_needs_fitting_scales_and_quantized_activations():
    x, packed, scale = random_case(17, 32, 64, torch.float32, seed=2)
    weight, weight_scale = pad_to_k_align(packed, scale)
    with pytest.raises(ValueError, match="lookup_scales=scale_bytes_fit"):
        mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, False, mxfp4_gemm_lookup.ROWS_32)
    with pytest.raises(ValueError, match="quantize_x must be True"):
        mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), False, False, mxfp4_gemm_lookup.ROWS_32,
                   lookup_scales=True)


@pytest.mark.parametrize("block_m, period", [(1, 8), (2, 2), (4, 1), (2, 4), (16, 3), (32, 8)])
def test_fp8_tiles_need_16_to_128_columns_and_a_known_period(block_m, period):
    with pytest.raises(ValueError, match=f"got period {period}, block_m {block_m}"):
        Fp8Config(block_m, 64, 4, 2, period=period)


def test_fp8_path_needs_quantized_activations():
    x, packed, scale = random_case(1, 32, 64, torch.float32, seed=0)
    weight, weight_scale = pad_to_k_align(packed, scale)
    with pytest.raises(ValueError, match="quantize_x must be True"):
        mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), False, True,
                   mxfp4_tuning.BLOCK_DIAGONAL_2)


def test_zero_weight_scale_byte_is_two_to_the_minus_127_on_the_fp8_path():
    x, packed, scale = random_case(2, 32, 64, torch.float32, seed=1)
    scale[:] = 0  # every weight is its e2m1 value times 2^-127 (subnormal)
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm((x * 2.0 ** 100).to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, True,
                     mxfp4_tuning.BLOCK_DIAGONAL_2)
    assert_matches(got, reference(x * 2.0 ** 100, packed, scale, True), torch.float32)


def test_paths_by_rows():
    x = torch.empty(0, 5376)
    assert pick_path(1, 21504, x, True) == DECODE  # CPU: no fp8 MMAs, and the slab path is GPU-only
    assert pick_path(4096, 21504, x, True) == LARGE_PREFILL
    assert mxfp4_gemm_fp8.pick_config(3, 21504, 5376) == mxfp4_tuning.BLOCK_DIAGONAL_4
    assert mxfp4_gemm_fp8.pick_config(5, 21504, 5376) == mxfp4_tuning.QUAD_DIAGONAL_8
    assert mxfp4_gemm_fp8.pick_config(16, 21504, 5376) == mxfp4_tuning.PAIR_DIAGONAL_16
    assert mxfp4_gemm_fp8.pick_config(32, 21504, 5376) == mxfp4_tuning.PAIR_DIAGONAL_16
    assert mxfp4_gemm_fp8.pick_config(40, 21504, 5376) == mxfp4_tuning.PER_BLOCK_32
    assert mxfp4_gemm_fp8.pick_config(4, 5376, 21504).split_k == 4  # 1 row tile x 84 N tiles
    assert mxfp4_gemm_fp8.pick_config(16, 5376, 21504).split_k == 4
    assert mxfp4_gemm_fp8.pick_config(16, 8192, 5376).split_k == 2
    assert mxfp4_gemm_fp8.pick_config(40, 5376, 21504).split_k == 1
    assert mxfp4_gemm_fp8.pick_config(24, 5376, 21504).split_k == 2  # 2 row tiles x 84 N tiles
    assert mxfp4_gemm_fp8.pick_config(32, 8192, 5376).split_k == 1


@pytest.mark.parametrize("n, k, split_k", [
    (43008, 5376, 2),  # 21 K steps in parts of at most 14
    (16384, 5376, 2),  # 128 tiles: 2 parts for 252 programs
    (5376, 21504, 6),  # 84 steps
    (5376, 8192, 6),  # 42 tiles: 6 parts for 252 programs, of 5-6 steps
])
def test_one_or_two_rows_of_long_k_split_k_by_steps_and_programs(n, k, split_k):
    for rows in (1, 2):
        config = mxfp4_gemm_fp8.pick_config(rows, n, k)
        assert dataclasses.replace(config, split_k=1) == mxfp4_tuning.WIDE_DIAGONAL_2
        assert config.split_k == split_k


@pytest.mark.parametrize("n, k, split_k", [(2816, 4096, 4), (8192, 2816, 2), (5376, 512, 4)])
def test_one_or_two_rows_of_short_k_keep_the_narrow_tiles(n, k, split_k):
    """Parts of fewer than 4 K steps (26B-A4B's shapes were not timed with the wide tiles): 64-row tiles, K split by
    their count (44, 128 and 84 tiles)."""
    config = mxfp4_gemm_fp8.pick_config(1, n, k)
    assert dataclasses.replace(config, split_k=1) == mxfp4_tuning.BLOCK_DIAGONAL_2
    assert config.split_k == split_k
    assert mxfp4_gemm_lookup.pick_config(5, 21504) == mxfp4_gemm_lookup.ROWS_16  # 336 tiles: no split
    assert mxfp4_gemm_lookup.pick_config(17, 21504) == mxfp4_gemm_lookup.ROWS_32
    assert mxfp4_gemm_lookup.pick_config(33, 21504) == mxfp4_gemm_lookup.ROWS_64
    assert mxfp4_gemm_lookup.pick_config(16, 5376).split_k == 4  # 84 tiles
    assert mxfp4_gemm_lookup.pick_config(64, 5376).split_k == 4
    assert mxfp4_gemm_lookup.pick_config(32, 8192).split_k == 2  # 128 tiles
    if torch.cuda.is_available():
        cuda = torch.empty(0, 5376, device="cuda")
        assert pick_path(4096, 21504, cuda, True) == dequantize_config(5376)  # fp32 x: bf16 slabs
        cuda_bf16 = cuda.bfloat16()
        if mxfp4_gemm_blockwise.supported(cuda_bf16, 21504):
            assert pick_path(128, 21504, cuda_bf16, True) == blockwise_config(5376)
            assert pick_path(127, 21504, cuda_bf16, True) == PREFILL
            assert pick_path(4096, 21504, cuda_bf16, False) == dequantize_config(5376)  # x not quantized
        if mxfp4_gemm_fp8.supported(cuda):
            assert pick_path(1, 21504, cuda, True) == mxfp4_gemm_fp8.pick_config(1, 21504, 5376)
            assert pick_path(1, 21504, cuda, False) == DECODE
            assert pick_path(4, 21504, cuda, True, lookup_scales=True) == mxfp4_tuning.BLOCK_DIAGONAL_4
            assert pick_path(5, 21504, cuda, True, lookup_scales=True) == mxfp4_gemm_lookup.ROWS_16
            assert pick_path(64, 21504, cuda, True, lookup_scales=True) == mxfp4_gemm_lookup.ROWS_64
            assert pick_path(16, 21504, cuda, True, lookup_scales=False) == mxfp4_tuning.PAIR_DIAGONAL_16
            assert pick_path(64, 21504, cuda, True, lookup_scales=False) == mxfp4_tuning.PER_BLOCK_32


def test_slabs_hold_about_the_same_number_of_values_whatever_k():
    assert dequantize_config(5376).rows == 8192
    assert dequantize_config(21504).rows == 2048
    assert dequantize_config(10 ** 6).rows == 256


def test_e4m3_slabs_split_long_k_weights_and_keep_short_k_weights_whole():
    assert blockwise_config(21504).rows == 4096
    assert blockwise_config(5376).rows >= 2 * 21504  # Gemma-4-31B's fused gate/up in one slab
    assert blockwise_config(5376).rows * 5376 <= 2 ** 28
    assert blockwise_config(10 ** 7).rows == 256


def test_decode_splits_k_only_when_n_has_few_tiles():
    assert pick_config(1, 21504) == DECODE
    assert pick_config(16, 5376).split_k == 4 and pick_config(16, 5376).block_n == DECODE.block_n
    assert pick_config(64, 5376) == PREFILL


@pytest.mark.parametrize("m, config", [(3, DECODE), (40, PREFILL), (40, LARGE_PREFILL)])
def test_shipped_configs_match_reference(m, config):
    x, packed, scale = random_case(m, 64, 256, torch.float32, seed=m)
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm(x.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, False, config)
    assert_matches(got, reference(x, packed, scale, True), torch.float32)


def loaded_linear(k: int, n: int, spec: LinearQuantSpec, backend: str, seed: int = 0) -> MXFP4Linear:
    """Built as a model built under --kernel-backend `backend` builds it (dispatch picks its kernel family)."""
    _, packed, scale = random_case(1, n, k, torch.float32, seed)
    with dispatch.use(detect_platform(torch.device(DEVICE)), backend):
        layer = MXFP4Linear(k, n, spec)
    assert layer.backend == backend
    layer.weight.weight_loader(layer.weight, packed)
    layer.weight_scale.weight_loader(layer.weight_scale, scale)
    layer.process_after_loading()
    return layer.to(DEVICE)


@pytest.mark.parametrize("dynamic", [True, False])
def test_linear_triton_backend_matches_torch_backend(dynamic):
    spec = LinearQuantSpec(dynamic_fp4_input=dynamic)
    x = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    expected = loaded_linear(96, 48, spec, "torch")(x)
    got = loaded_linear(96, 48, spec, "triton")(x)
    assert got.shape == (2, 3, 48)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


@pytest.mark.parametrize("m, n, k, config", [
    (1, 40, 96, Fp8Config(2, 64, 4, 2, period=8)),             # K tail
    (3, 72, 544, Fp8Config(4, 64, 4, 2, split_k=2, period=8)),
    (5, 72, 288, Fp8Config(8, 64, 4, 2, period=2)),
    (5, 72, 544, LookupConfig(16, 64, 4, 2, split_k=2)),
])
def test_gated_paths_quantize_gelu_tanh_of_gate_times_up(m, n, k, config):
    """x = [gate | up]: the activation quantization computes gelu_tanh(gate) * up (fp32) before rounding it."""
    _, packed, scale = random_case(m, n, k, torch.float32, seed=m + n)
    gate_up = torch.randn(m, 2 * k, generator=torch.Generator().manual_seed(k))
    weight, weight_scale = pad_to_k_align(packed, scale)
    got = mxfp4_gemm(gate_up.to(DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, False, config,
                     lookup_scales=isinstance(config, LookupConfig), gated=True)
    assert_matches(got, reference(gelu_tanh_and_mul(gate_up), packed, scale, True), torch.float32, FP8_SUMS_RTOL)


def test_gated_gemm_refuses_paths_without_a_gated_quantization():
    _, packed, scale = random_case(1, 32, 64, torch.float32, seed=3)
    weight, weight_scale = pad_to_k_align(packed, scale)
    with pytest.raises(ValueError, match="check gated_path first"):
        mxfp4_gemm(torch.randn(1, 128, device=DEVICE), weight.to(DEVICE), weight_scale.to(DEVICE), True, False,
                   SMALL_DECODE, gated=True)


@pytest.mark.parametrize("rows", [1, 3, 16, 100])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_activation_linked_to_the_linear_gives_the_unlinked_result(rows, backend):
    """Linked to a Triton MXFP4 linear, the activation hands it [gate | up] where its fp8 or lookup path runs (GPU,
    1-64 rows), whose input quantization computes the activation; elsewhere it computes it itself. Both give the
    same numbers."""
    from atomlite.model_ops.activation import GeluTanhAndMul
    layer = loaded_linear(96, 48, LinearQuantSpec(dynamic_fp4_input=True), backend)
    gate_up = torch.randn(rows, 192, generator=torch.Generator().manual_seed(rows)).to(DEVICE)
    act = GeluTanhAndMul(96)
    expected = layer(act(gate_up))
    link_feed(act, layer)
    assert (act.reader_takes_gated == layer.takes_gated) == (backend == "triton")
    got = layer(act(gate_up))
    # gelu in fp32 and rounded once either way; on a GPU the fp8 MMA's sums
    torch.testing.assert_close(got, expected, rtol=FP8_SUMS_RTOL, atol=FP8_SUMS_RTOL * expected.abs().max().item())


def test_linear_torch_backend_quantizes_inputs_only_when_the_spec_says_so():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6))
    for dynamic in (True, False):
        layer = loaded_linear(64, 32, LinearQuantSpec(dynamic_fp4_input=dynamic), "torch").cpu()
        w = mxfp4.dequantize(layer.weight, layer.weight_scale)
        xr = mxfp4.quantize_dequantize(x) if dynamic else x
        torch.testing.assert_close(layer(x), xr @ w.T)


@pytest.mark.parametrize("param_name, tensor, expected", [
    ("weight", torch.zeros(32, 64, dtype=torch.uint8), r"expected torch.uint8 \(32, 32\), got torch.uint8 \(32, 64\)"),
    ("weight_scale", torch.zeros(32, 4, dtype=torch.uint8),
     r"expected torch.uint8 \(32, 2\), got torch.uint8 \(32, 4\)"),
    ("weight_scale", torch.zeros(32, 2, dtype=torch.bfloat16), r"expected torch.uint8 \(32, 2\), got torch.bfloat16"),
    ("weight", torch.zeros(32, 64, dtype=torch.bfloat16), r"got torch.bfloat16 \(32, 64\)"),  # an unquantized weight
])
def test_weight_loader_refuses_wrong_shape_or_dtype(param_name, tensor, expected):
    layer = MXFP4Linear(64, 32, LinearQuantSpec(dynamic_fp4_input=True))
    param = getattr(layer, param_name)
    with pytest.raises(ValueError, match=expected):
        param.weight_loader(param, tensor)


def test_in_features_must_be_a_multiple_of_the_block():
    with pytest.raises(ValueError, match="divisible by 32, got 48"):
        MXFP4Linear(48, 32, LinearQuantSpec(dynamic_fp4_input=True))


@pytest.mark.parametrize("rows", [1, 3])
def test_gemm_on_rows_quantized_by_the_norm_equals_the_gemm_on_the_norms_output(rows):
    """RMSNorm.add_to_residual's QuantizedRows through quantized_fp8_gemm give the fp8 path's result on the
    unquantized norm output (summed and as PartialSums); rows quantized in another form are refused."""
    from atomlite.model_ops.carriers import InputQuantization, PartialSums
    from atomlite.model_ops.triton.mxfp4 import fp8_tiles as fp8
    from atomlite.model_ops.triton.norm.residual import rms_norm_residual
    _, packed, scale = random_case(rows, 72, 544, torch.bfloat16, seed=rows)
    weight, weight_scale = (t.to(DEVICE) for t in pad_to_k_align(packed, scale))
    g = torch.Generator().manual_seed(rows)
    x, residual, norm_w = (torch.randn(*shape, generator=g).to(DEVICE, torch.bfloat16)
                           for shape in ((rows, 544), (rows, 544), (544,)))
    _, out = rms_norm_residual(x, residual, norm_w, 1e-6, None, norm_w)
    form = InputQuantization(fp8.pick_config(rows, 72, weight.shape[1] * 2).period, weight.shape[1] * 2)
    _, quantized = rms_norm_residual(x, residual, norm_w, 1e-6, None, norm_w, quantize=form)
    expected = fp8.mxfp4_gemm_fp8(out, weight, weight_scale)
    assert torch.equal(fp8.quantized_fp8_gemm(quantized, weight, weight_scale), expected)
    unsummed = fp8.quantized_fp8_gemm(quantized, weight, weight_scale, summed=False)
    assert isinstance(unsummed, PartialSums)
    assert torch.equal(unsummed.parts, fp8.mxfp4_gemm_fp8(out, weight, weight_scale, summed=False).parts)
    other = InputQuantization(1 if form.period != 1 else 2, form.k_padded)
    with pytest.raises(ValueError, match="ask input_quantization"):
        fp8.quantized_fp8_gemm(rms_norm_residual(x, residual, norm_w, 1e-6, None, norm_w, quantize=other)[1],
                               weight, weight_scale)
