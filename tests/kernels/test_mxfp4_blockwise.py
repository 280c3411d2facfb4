"""The large-M fp8 path (mxfp4_gemm_blockwise): its folding of MXFP4 blocks into e4m3 values with one factor per
128-K group, against the torch reference (on CPU under TRITON_INTERPRET=1), and the whole GEMM on a Hopper GPU."""
import pytest
import torch

from atomlite.model_ops.triton.mxfp4 import blockwise
from atomlite.model_ops.triton.mxfp4.gemm import mxfp4_gemm, pad_to_k_align, pick_path
from atomlite.quant import mxfp4

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HOPPER = torch.cuda.is_available() and blockwise.supported(torch.empty(0, dtype=torch.bfloat16, device="cuda"), 16)


def spread_blocks(rows: int, k: int, low: int, high: int, seed: int) -> torch.Tensor:
    """Random values whose 32-blocks have magnitudes 2^low .. 2^high."""
    gen = torch.Generator().manual_seed(seed)
    exponents = torch.randint(low, high + 1, (rows, k // 32), generator=gen).float()
    return torch.randn(rows, k, generator=gen) * torch.exp2(exponents).repeat_interleave(32, dim=1)


def unfold(values: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """e4m3 [R, K'] and factors [R, K'/128] -> the fp32 values they stand for."""
    return values.float().cpu() * factors.float().cpu().repeat_interleave(blockwise.GROUP, dim=1)


@pytest.mark.parametrize("m, k", [(3, 256), (21, 544), (16, 1024)])  # rows past a program's 16; a K tail
def test_activations_fold_exactly_within_14_binades(m, k):
    x = spread_blocks(m, k, -7, 6, seed=m + k)  # 14 binades of block magnitudes: every block exact
    k_padded = -(-k // 256) * 256
    xq, factors = blockwise.quantize_activations(x.to(DEVICE), k_padded)
    assert xq.shape == (m, k_padded) and factors.shape == (m, k_padded // 128) and factors.stride(0) == 1
    got = unfold(xq, factors)
    torch.testing.assert_close(got[:, :k], mxfp4.quantize_dequantize(x), rtol=0, atol=0)
    assert not got[:, k:].any()


# One e4m3 subnormal step of the group's factor: the GPU rounds to nearest (half a step), the interpreter truncates.
ROUNDING = 2.0 ** -9


def test_activation_blocks_far_below_their_group_round_within_a_subnormal_step_of_its_factor():
    x = spread_blocks(2, 256, 0, 0, seed=1)
    x[0, 32:64] *= 2.0 ** -20  # 20 binades under its group's other blocks
    x[1, 128:256] *= 2.0 ** -200  # a whole group under 2^-120: zeros
    xq, factors = blockwise.quantize_activations(x.to(DEVICE), 256)
    got, expected = unfold(xq, factors), mxfp4.quantize_dequantize(x)
    assert (got[0, 32:64] != expected[0, 32:64]).any()
    assert (got[0, 32:64] - expected[0, 32:64]).abs().max() < ROUNDING * factors[0, 0].item()
    torch.testing.assert_close(got[0, 64:], expected[0, 64:], rtol=0, atol=0)
    assert not got[1, 128:].any()


@pytest.mark.parametrize("n", [40, 64, 130])  # rows past a program's 64
def test_weights_fold_exactly_within_14_binades(n):
    packed, scale = mxfp4.quantize(spread_blocks(n, 512, -10, 3, seed=n))
    weight, weight_scale = pad_to_k_align(packed, scale)
    k_padded = weight.shape[1] * 2
    wq = torch.empty((n, k_padded), dtype=torch.float8_e4m3fn, device=DEVICE)
    flat = torch.full((n * k_padded // 128,), float("nan"), device=DEVICE)
    values, factors = blockwise.expand_weight(weight.to(DEVICE), weight_scale.to(DEVICE), wq, flat)
    assert factors.shape == (n, k_padded // 128) and factors.stride(0) == 1
    torch.testing.assert_close(unfold(values, factors), mxfp4.dequantize(weight, weight_scale), rtol=0, atol=0)


def test_weight_blocks_far_below_their_group_round_within_a_subnormal_step_of_its_factor():
    w = spread_blocks(1, 256, 0, 0, seed=2)
    w[0, 96:128] *= 2.0 ** -17
    packed, scale = mxfp4.quantize(w)
    wq = torch.empty((1, 256), dtype=torch.float8_e4m3fn, device=DEVICE)
    flat = torch.empty(2, device=DEVICE)
    values, factors = blockwise.expand_weight(packed.to(DEVICE), scale.to(DEVICE), wq, flat)
    got, expected = unfold(values, factors), mxfp4.dequantize(packed, scale)
    assert (got[0, 96:128] - expected[0, 96:128]).abs().max() < ROUNDING * factors[0, 0].item()
    torch.testing.assert_close(got[0, :96], expected[0, :96], rtol=0, atol=0)
    torch.testing.assert_close(got[0, 128:], expected[0, 128:], rtol=0, atol=0)


def test_blockwise_config_is_refused_where_it_cannot_run():
    packed, scale = mxfp4.quantize(spread_blocks(64, 256, 0, 0, seed=3))
    x = torch.randn(4, 256, device=DEVICE)  # fp32 activations
    with pytest.raises(ValueError, match="BlockwiseConfig multiplies MXFP4-quantized bf16"):
        mxfp4_gemm(x, packed.to(DEVICE), scale.to(DEVICE), True, True, blockwise.BlockwiseConfig(rows=64))
    with pytest.raises(ValueError, match="in slabs of a multiple of 16 rows"):
        mxfp4_gemm(x.bfloat16(), packed.to(DEVICE), scale.to(DEVICE), True, True, blockwise.BlockwiseConfig(rows=24))


@pytest.mark.skipif(not HOPPER, reason="cuBLAS's 1x128 block-scaled fp8 GEMM: NVIDIA sm_90 only")
@pytest.mark.parametrize("m, n, k, rows", [
    (600, 4096, 5376, 4096),   # one slab; M not a multiple of 16
    (512, 1008, 1056, 256),    # 4 slabs, both buffers reused, the last one short; K padded
    (1024, 768, 2048, 512),
])
def test_blockwise_gemm_matches_reference_on_hopper(m, n, k, rows):
    """Block magnitudes within 14 binades on both sides: the operands are exact, the sums fp32 per 128-K group."""
    x = spread_blocks(m, k, -4, 4, seed=m).to(torch.bfloat16)
    packed, scale = mxfp4.quantize(spread_blocks(n, k, -10, 0, seed=n))
    weight, weight_scale = pad_to_k_align(packed, scale)
    config = blockwise.BlockwiseConfig(rows=rows)
    assert isinstance(pick_path(m, n, x.cuda(), True), blockwise.BlockwiseConfig)
    assert not isinstance(pick_path(m, n + 8, x.cuda(), True), blockwise.BlockwiseConfig)  # cuBLAS: N % 16
    got = mxfp4_gemm(x.cuda(), weight.cuda(), weight_scale.cuda(), True, True, config)
    expected = mxfp4.quantize_dequantize(x.double()) @ mxfp4.dequantize(packed, scale).double().T
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double().cpu(), expected, rtol=2 ** -7, atol=2 ** -7 * expected.abs().max().item())
