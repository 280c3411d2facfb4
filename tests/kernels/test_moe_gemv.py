"""The few-pairs MoE kernels (triton.moe_gemv: one program per pair and block of features, no routing; on CPU under
TRITON_INTERPRET=1) against the per-expert torch loop."""
import pytest
import torch

from atomlite.model_ops.torch_ref.moe import moe_experts as reference
from atomlite.model_ops.torch_ref.moe import mxfp4_moe_experts as mxfp4_reference
from atomlite.model_ops.triton.moe import gemm as moe_gemm
from atomlite.model_ops.triton.moe.common import ExpertWeights
from atomlite.model_ops.triton.moe.gemv import bf16_config, gemv_experts
from atomlite.model_ops.triton.moe.gemv_fp8 import gemv_experts_fp8
from atomlite.model_ops.triton.moe.tuning import GEMV_BF16, GEMV_MAX_PAIRS, Fp8GemvConfig, GemvConfig, GemvTiles
from test_moe_gemm import DEVICE, assert_close, padded, random_experts, random_mxfp4_experts, random_routing

# several N tiles and K steps per projection at these shapes, partial last ones
SMALL = GemvConfig(GemvTiles(16, 32, 4), GemvTiles(16, 32, 4))


@pytest.mark.parametrize("tokens,top_k,num_experts,hidden,inner", [
    (1, 1, 4, 64, 32),     # one token, one expert
    (1, 8, 16, 96, 48),    # top 8; K and N not multiples of the tiles
    (4, 8, 8, 64, 32),     # experts repeat across tokens
])
def test_gemv_experts_match_the_per_expert_loop(tokens, top_k, num_experts, hidden, inner):
    gate_up, down = random_experts(num_experts, hidden, inner, seed=tokens)
    weights, ids = random_routing(tokens, top_k, num_experts, seed=tokens + 1)
    x = torch.randn(tokens, hidden, device=DEVICE)
    got = gemv_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, quantize_x=False, config=SMALL)
    assert_close(got, reference(x, gate_up, down, weights, ids))


@pytest.mark.parametrize("tokens,inner", [(1, 40), (3, 704)])
def test_bf16_down_reads_an_inner_row_that_fits_one_tile_in_one_load(tokens, inner):
    """The default bf16 tiles: an inner size up to a tile's width (26B-A4B's 704) is one masked down tile per row,
    with no tile loaded ahead; wider ones keep the K loop."""
    assert bf16_config(inner).down.block_k >= inner and bf16_config(4 * 1024) == GEMV_BF16
    gate_up, down = random_experts(8, 64, inner, seed=inner)
    weights, ids = random_routing(tokens, 4, 8, seed=inner + 1)
    x = torch.randn(tokens, 64, device=DEVICE)
    got = gemv_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, quantize_x=False)
    assert_close(got, reference(x, gate_up, down, weights, ids))


def mxfp4_case(tokens, top_k, num_experts, hidden, inner, wide, quantize_x):
    """(x, gate_up, down as the Triton kernels take them, routing weights, ids, the per-expert loop's result)."""
    (gate_up, gate_up_scale), (down, down_scale) = random_mxfp4_experts(num_experts, hidden, inner, tokens, wide)
    weights, ids = random_routing(tokens, top_k, num_experts, seed=tokens + 1)
    x = torch.randn(tokens, hidden, device=DEVICE)
    want = mxfp4_reference(x, *(t.to(DEVICE) for t in (gate_up, gate_up_scale, down, down_scale)), weights, ids,
                           quantize_x)
    return x, padded(gate_up, gate_up_scale, wide), padded(down, down_scale, wide), weights, ids, want


@pytest.mark.parametrize("tokens,top_k,num_experts,hidden,inner", [(1, 1, 4, 64, 32), (2, 8, 16, 96, 48)])
@pytest.mark.parametrize("quantize_x", [True, False])
@pytest.mark.parametrize("wide", [False, True])
def test_gemv_mxfp4_experts_match_the_per_expert_loop(tokens, top_k, num_experts, hidden, inner, quantize_x, wide):
    """The gate_up kernel quantizes x itself; partial last 32-blocks along both K (96 and 48)."""
    x, gate_up, down, weights, ids, want = mxfp4_case(tokens, top_k, num_experts, hidden, inner, wide, quantize_x)
    assert_close(gemv_experts(x, gate_up, down, weights, ids, quantize_x, config=SMALL), want)


@pytest.mark.parametrize("tokens,top_k,num_experts,hidden,inner", [
    (1, 1, 4, 64, 32),     # one token, one expert
    (1, 8, 16, 96, 48),    # top 8; partial last 32-blocks along both K (96 and 48), rows past the tiles
    (4, 8, 8, 288, 80),    # experts repeat across tokens; two K steps of gate_up
])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("splits", [None, 1, 2])
def test_fp8_gemv_mxfp4_experts_match_the_per_expert_loop(tokens, top_k, num_experts, hidden, inner, wide, splits):
    """The fp8-MMA kernels (sm_89+ on a GPU; here the interpreter) with dynamic MXFP4 activations; gate_up's K
    split in two where it has two steps (hidden 288), else one split; None: the launcher's choice."""
    x, gate_up, down, weights, ids, want = mxfp4_case(tokens, top_k, num_experts, hidden, inner, wide, True)
    got = gemv_experts_fp8(x, gate_up, down, weights, ids, Fp8GemvConfig(64, 64, gate_up_splits=splits))
    if DEVICE == "cuda":  # the fp8 MMA's sums are not fp32's, and may move an inner activation across a rounding
        assert ((got - want).norm() / want.norm()).item() < 4e-3
    else:
        assert_close(got, want)


@pytest.mark.parametrize("tokens,gemv", [(GEMV_MAX_PAIRS // 2, True), (GEMV_MAX_PAIRS // 2 + 1, False)])
def test_the_op_takes_the_gemv_kernels_up_to_max_pairs(tokens, gemv, monkeypatch):
    gate_up, down = random_experts(8, 64, 32, seed=11)
    weights, ids = random_routing(tokens, 2, 8, seed=12)
    x = torch.randn(tokens, 64, device=DEVICE)
    calls, run = [], moe_gemm.gemv_experts
    monkeypatch.setattr(moe_gemm, "gemv_experts", lambda *a, **kw: (calls.append(1), run(*a, **kw))[1])
    assert_close(moe_gemm.moe_experts(x, gate_up, down, weights, ids), reference(x, gate_up, down, weights, ids))
    assert bool(calls) == gemv


def test_mxfp4_k_tiles_must_divide_the_padding():
    (gate_up, gate_up_scale), (down, down_scale) = random_mxfp4_experts(4, 64, 32, seed=1, wide=False)
    weights, ids = random_routing(1, 2, 4, seed=2)
    odd = GemvConfig(GemvTiles(16, 48, 4), GemvTiles(16, 32, 4))
    with pytest.raises(ValueError, match="block_k 48"):
        gemv_experts(torch.randn(1, 64, device=DEVICE), padded(gate_up, gate_up_scale, False),
                     padded(down, down_scale, False), weights, ids, True, config=odd)


def test_no_pairs_give_an_empty_output():
    gate_up, down = random_experts(4, 64, 32, seed=13)
    ids = torch.empty(0, 2, dtype=torch.int64, device=DEVICE)
    out = gemv_experts(torch.empty(0, 64, device=DEVICE), ExpertWeights(gate_up), ExpertWeights(down),
                       torch.empty(0, 2, device=DEVICE), ids, quantize_x=False)
    assert out.shape == (0, 64)
