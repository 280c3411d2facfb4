"""MXFP4 GEMMs of many rows on an e4m3 copy of the weight (row_copy.py): the weight and activations folded per row,
against the torch reference (on CPU under TRITON_INTERPRET=1), the layers that take the copy from 65 rows, the memory
rule that decides whether copies are made, and the GEMM on a GPU with fp8 tensor cores."""
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

from atomlite.config import EngineConfig
from atomlite.model_ops import dispatch
from atomlite.model_ops.mxfp4_linear import MXFP4Linear, make_row_copies
from atomlite.model_ops.platform import Platform, detect_platform
from atomlite.model_ops.triton.mxfp4 import family, row_copy
from atomlite.model_ops.triton.mxfp4.gemm import mxfp4_gemm, pad_to_k_align
from atomlite.quant import mxfp4
from atomlite.plan import plan_report
from atomlite.quant.quark import LinearQuantSpec
from test_mxfp4_blockwise import spread_blocks

EXAMPLES = Path(__file__).parents[2] / "examples" / "configs"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_GPU = torch.cuda.is_available() and row_copy.supported(detect_platform(torch.device("cuda")))


def packed_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_to_k_align(*mxfp4.quantize(w))


@pytest.mark.parametrize("n, k", [(3, 256), (40, 544)])  # K padded to 768: zero codes under scale byte 127
def test_weight_copy_is_exact_within_14_binades(n, k):
    weight, scale = packed_weight(spread_blocks(n, k, -12, 1, seed=n))  # block scales 14 binades apart
    copy = row_copy.make_row_copy(weight, scale)
    assert copy.weight.dtype == torch.float8_e4m3fn and copy.weight.shape == (n, weight.shape[1] * 2)
    assert copy.factors.shape == (n, 1)
    torch.testing.assert_close(copy.weight.float() * copy.factors, mxfp4.dequantize(weight, scale), rtol=0, atol=0)


def test_weight_copy_ignores_zero_blocks_and_is_refused_for_a_block_too_far_below():
    w = spread_blocks(2, 256, 0, 0, seed=3)
    w[0, :32] = 0.0  # a zero block: its scale is not the row's concern
    weight, scale = packed_weight(w)
    scale[0, 0] = 0
    assert row_copy.make_row_copy(weight, scale) is not None
    w[1, 64:96] *= 2.0 ** -17  # 17 binades under the row's other blocks
    assert row_copy.make_row_copy(*packed_weight(w)) is None


@pytest.mark.parametrize("m, k", [(3, 256), (21, 544)])  # rows past a program's 8; a K tail
def test_activations_fold_exactly_within_14_binades(m, k):
    x = spread_blocks(m, k, -7, 6, seed=m + k)
    x[1] = 0.0  # a zero row: zeros
    k_padded = -(-k // 256) * 256
    xq, factors = row_copy.fold_activations(x.to(DEVICE), k_padded)
    assert xq.shape == (m, k_padded) and factors.shape == (m, 1)
    got = xq.float().cpu() * factors.cpu()
    torch.testing.assert_close(got[:, :k], mxfp4.quantize_dequantize(x), rtol=0, atol=0)
    assert not got[:, k:].any() and not got[1].any()


def test_activation_blocks_far_below_their_row_round_within_a_subnormal_step_of_its_factor():
    x = spread_blocks(2, 512, 0, 0, seed=1)
    x[0, 288:320] *= 2.0 ** -20  # 20 binades under its row's other blocks, in the second 256-K step
    x[1] *= 2.0 ** -122  # a row whose largest block exponent is under -120: zeros, where the reference is not
    xq, factors = row_copy.fold_activations(x.to(DEVICE), 512)
    got, expected = xq.float().cpu() * factors.cpu(), mxfp4.quantize_dequantize(x)
    assert expected[1].any()
    assert (got[0, 288:320] != expected[0, 288:320]).any()
    assert (got[0, 288:320] - expected[0, 288:320]).abs().max() <= 2.0 ** -10 * factors[0, 0].item()
    torch.testing.assert_close(got[0, :288], expected[0, :288], rtol=0, atol=0)
    assert not got[1].any()


def test_row_copy_gemm_matches_the_reference():
    m, n, k = 70, 48, 544
    x = spread_blocks(m, k, -4, 4, seed=5)
    w = spread_blocks(n, k, -10, 0, seed=6)
    weight, scale = packed_weight(w)
    got = row_copy.row_copy_gemm(x.to(DEVICE), row_copy.make_row_copy(weight.to(DEVICE), scale.to(DEVICE)))
    expected = mxfp4.quantize_dequantize(x.double()) @ mxfp4.dequantize(weight, scale)[:, :k].double().T
    # fp32 dots under the interpreter; a GPU's fp8 MMAs sum with fewer bits (H200: within 6e-4 of the largest)
    tolerance = 1e-5 if DEVICE == "cpu" else 2 ** -9
    torch.testing.assert_close(got.double().cpu(), expected, rtol=tolerance,
                               atol=tolerance * expected.abs().max().item())


def test_the_triton_layer_takes_its_copy_from_65_rows():
    weight, scale = (t.to(DEVICE) for t in packed_weight(spread_blocks(32, 256, -6, 0, seed=7)))
    facts = family.MXFP4_LINEAR.with_row_copy(weight, scale, None)
    assert facts.row_copy is not None and family.MXFP4_LINEAR.ROW_COPY_MIN_ROWS == 65
    for m, copied in ((64, False), (65, True)):
        x = spread_blocks(m, 256, -2, 2, seed=m).to(DEVICE, torch.bfloat16)
        with mock.patch.object(family, "row_copy_gemm", wraps=family.row_copy_gemm) as spy:
            got = family.MXFP4_LINEAR.matmul(x, weight, scale, facts, quantize_x=True)
        assert spy.called == copied
        want = mxfp4_gemm(x, weight, scale, True).float()  # both rounded to bf16: a step of 2^-8 apart at most
        torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=2 ** -7 * want.abs().max().item())
    x = spread_blocks(65, 256, -2, 2, seed=8).to(DEVICE, torch.bfloat16)
    with mock.patch.object(family, "row_copy_gemm") as spy:  # weight-only MXFP4 (x as it is) keeps its paths
        family.MXFP4_LINEAR.matmul(x, weight, scale, facts, quantize_x=False)
        family.MXFP4_LINEAR.matmul(x.float(), weight, scale, facts, quantize_x=True)  # and so do fp32 activations
    assert not spy.called


class TwoLayers(nn.Module):
    def __init__(self, weights):
        super().__init__()
        with dispatch.use(Platform("cuda", "sm_90")):
            self.layers = nn.ModuleList(MXFP4Linear(256, 32, LinearQuantSpec(dynamic_fp4_input=True))
                                        for _ in weights)
        for layer, w in zip(self.layers, weights):
            packed, scale = mxfp4.quantize(w)
            layer.weight.weight_loader(layer.weight, packed)
            layer.weight_scale.weight_loader(layer.weight_scale, scale)
            layer.process_after_loading()


def test_copies_are_made_for_all_layers_within_the_budget_or_for_none():
    """On an fp8 GPU (the support check stands in for one here); a layer whose blocks are too far apart keeps none."""
    far = spread_blocks(32, 256, 0, 0, seed=9)
    far[0, :32] *= 2.0 ** -18
    model = TwoLayers([spread_blocks(32, 256, -3, 0, seed=10), far])
    with mock.patch.object(family, "row_copy_supported", lambda device: True):
        need = sum(layer.row_copy_bytes() for layer in model.layers)
        assert need == 2 * 32 * (256 + 4)
        line = make_row_copies(model, budget=need - 1)
        assert line.startswith("mxfp4: no e4m3 weight copies") and "half the" in line
        assert all(layer.prepared.row_copy is None for layer in model.layers)
        line = make_row_copies(model, budget=need)
    assert line.startswith("mxfp4: e4m3 copies of 1 of 2 weights") and "65+ rows" in line and "14 binades" in line
    assert model.layers[0].prepared.row_copy is not None and model.layers[1].prepared.row_copy is None
    assert make_row_copies(model, budget=None) is None  # this CPU has no fp8 tensor cores: no copies, no line


@pytest.mark.parametrize("platform, copies", [(Platform("cuda", "sm_90"), True), (Platform("cuda", "sm_80"), False),
                                               (Platform("rocm", "gfx950"), False), (Platform("cpu"), False)])
def test_plan_says_what_the_copies_would_take(platform, copies):
    config = EngineConfig(model=str(EXAMPLES / "gemma-4-31B-it-mxfp4"))
    lines, _ = plan_report(config, 20 * 2**30, platform)
    weights = next(float(line.split("weights ")[1].split(" GiB")[0]) for line in lines if "weights " in line)
    copy_lines = [line for line in lines if line.startswith("mxfp4: e4m3 copies of 240 weights for GEMMs of 65+ rows")]
    assert len(copy_lines) == copies
    if copies:  # one byte a weight: about 1.6 times the packed weights' 4.25 bits and the bf16 embedding
        assert 1.5 * weights < float(copy_lines[0].split("rows, ")[1].split(" GiB")[0]) < 1.7 * weights


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="fp8 e4m3 tensor cores: NVIDIA sm_89 and newer")
@pytest.mark.parametrize("m", [65, 96, 160, 600, 2048])  # the Triton row tiles, then cuBLAS's row-scaled GEMM
def test_row_copy_gemm_matches_the_reference_on_the_gpu(m):
    n, k = 1008, 1056
    x = spread_blocks(m, k, -4, 4, seed=m).to(torch.bfloat16)
    weight, scale = packed_weight(spread_blocks(n, k, -10, 0, seed=n))
    copy = row_copy.make_row_copy(weight.cuda(), scale.cuda())
    x_gpu = x.cuda()
    eager = row_copy.row_copy_gemm(x_gpu, copy)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        row_copy.row_copy_gemm(x_gpu, copy)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            replayed = row_copy.row_copy_gemm(x_gpu, copy)
    graph.replay()
    torch.cuda.synchronize()
    expected = mxfp4.quantize_dequantize(x.double()) @ mxfp4.dequantize(weight, scale)[:, :k].double().T
    for got in (eager, replayed):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double().cpu(), expected, rtol=2 ** -7,
                                   atol=2 ** -7 * expected.abs().max().item())
