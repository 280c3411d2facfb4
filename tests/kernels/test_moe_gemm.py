"""The fused MoE experts (triton.moe_gemm; on CPU under TRITON_INTERPRET=1) against the per-expert torch loop."""
import pytest
import torch

from atomlite.model_ops import dispatch, kernels
from atomlite.model_ops.moe import Experts
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.torch_ref.moe import moe_experts as reference
from atomlite.model_ops.torch_ref.moe import mxfp4_moe_experts as mxfp4_reference
from atomlite.model_ops.triton.moe.common import MAX_GRID_TILES, column_first_grid
from atomlite.model_ops.triton.moe.gemm import (DECODE, MEDIUM, PREFILL, ExpertWeights, MoeConfig, ProjectionTiles,
                                                _tail_columns, fused_experts, moe_experts, mxfp4_moe_experts,
                                                pick_config)
from atomlite.model_ops.triton.mxfp4.gemm import needs_wide_scales, pad_to_k_align
from atomlite.quant import mxfp4

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# small tiles: several N tiles and K steps per projection at these shapes, partial last ones
SMALL = MoeConfig(16, gate_up=ProjectionTiles(32, 32, 4, 2), down=ProjectionTiles(32, 32, 4, 2))


def random_experts(num_experts: int, hidden: int, inner: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inner, hidden, generator=gen) * hidden ** -0.5
    down = torch.randn(num_experts, hidden, inner, generator=gen) * inner ** -0.5
    return gate_up.to(DEVICE), down.to(DEVICE)


def random_routing(tokens: int, top_k: int, num_experts: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    return weights.to(DEVICE), ids.to(DEVICE)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    # fp32: summation order only
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("tokens,top_k,num_experts,hidden,inner,config", [
    (1, 1, 4, 64, 32, SMALL),      # one token, one expert
    (1, 8, 16, 96, 48, SMALL),     # top 8, K and N not multiples of the tiles
    (7, 2, 8, 64, 32, SMALL),
    (9, 8, 8, 64, 32, DECODE),     # every expert gets several tokens
    (40, 2, 4, 64, 64, MEDIUM),    # tiles of 32 rows, several per expert
    (70, 2, 4, 64, 64, PREFILL),   # tiles of 64 rows; placed by two launches
])
def test_fused_experts_match_the_per_expert_loop(tokens, top_k, num_experts, hidden, inner, config):
    gate_up, down = random_experts(num_experts, hidden, inner, seed=tokens)
    weights, ids = random_routing(tokens, top_k, num_experts, seed=tokens + 1)
    x = torch.randn(tokens, hidden, device=DEVICE)
    got = fused_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, config=config)
    assert_close(got, reference(x, gate_up, down, weights, ids))


def test_uneven_routing_and_experts_with_no_token():
    gate_up, down = random_experts(8, 64, 32, seed=3)
    ids = torch.tensor([[3, 0], [3, 5], [3, 0], [3, 5], [3, 0], [3, 7]] * 4, device=DEVICE)  # 1, 2, 4, 6: none
    weights = torch.rand(ids.shape, device=DEVICE)
    x = torch.randn(ids.shape[0], 64, device=DEVICE)
    got = fused_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, config=SMALL)
    assert_close(got, reference(x, gate_up, down, weights, ids))


# tiles of 32 rows of which the ones holding at most 16 (an expert's last) multiply only those 16
TAILED = MoeConfig(32, gate_up=ProjectionTiles(32, 32, 4, 2), down=ProjectionTiles(32, 32, 4, 2), tail_m=16)


def tailed_routing():
    """Expert 0: 40 pairs (a full tile, then a tail of 8); 1: 24 (one partial tile past the tail's 16 rows);
    2: exactly 16 (a tail); 3: none."""
    ids = torch.tensor([[0, 2]] * 16 + [[1, 0]] * 20 + [[0, 1]] * 4, device=DEVICE)
    return torch.rand(ids.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE), ids


def test_tiles_of_an_experts_last_rows_take_the_tail_path():
    gate_up, down = random_experts(4, 64, 48, seed=8)
    weights, ids = tailed_routing()
    x = torch.randn(ids.shape[0], 64, device=DEVICE)
    got = fused_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, config=TAILED)
    assert_close(got, reference(x, gate_up, down, weights, ids))


def test_gate_ups_last_column_block_computes_the_remainder_alone():
    """inner 80 on 64-wide column tiles: the last block's 16 columns on a 16-wide tile, beside the row tails."""
    gate_up, down = random_experts(4, 64, 80, seed=11)
    weights, ids = tailed_routing()
    x = torch.randn(ids.shape[0], 64, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    config = MoeConfig(32, gate_up=ProjectionTiles(64, 32, 4, 2), down=TAILED.down, tail_m=16)
    got = fused_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, config=config)
    assert_close(got, reference(x, gate_up, down, weights, ids))
    assert _tail_columns(80, 64, False) == 16 and _tail_columns(704, 128, False) == 64  # Gemma-4-26B-A4B's inner
    assert _tail_columns(704, 128, True) == 64 and _tail_columns(48, 32, True) == 32  # MXFP4 blocks stay whole
    assert _tail_columns(704, 64, False) == 64 and _tail_columns(200, 128, False) == 128  # no remainder; no saving


def test_the_grid_walks_a_tiles_column_blocks_first_and_refuses_more_tiles_than_its_axis_holds():
    assert column_first_grid(MAX_GRID_TILES, 11) == (11, MAX_GRID_TILES)
    with pytest.raises(ValueError, match="--max-num-batched-tokens"):
        column_first_grid(MAX_GRID_TILES + 1, 11)


@pytest.mark.parametrize("tail", [8, 24, 64])
def test_tails_that_are_no_dot_shape_are_refused(tail):
    gate_up, down = random_experts(4, 64, 48, seed=8)
    weights, ids = tailed_routing()
    config = MoeConfig(32, TAILED.gate_up, TAILED.down, tail_m=tail)
    with pytest.raises(ValueError, match=f"tail_m {tail} is not a power of two from 16"):
        fused_experts(torch.randn(ids.shape[0], 64, device=DEVICE), ExpertWeights(gate_up), ExpertWeights(down),
                      weights, ids, config=config)


def test_mxfp4_tail_tiles_quantize_only_their_rows():
    (gate_up, gate_up_scale), (down, down_scale) = random_mxfp4_experts(4, 64, 64, seed=9, wide=False)
    weights, ids = tailed_routing()
    x = mxfp4.quantize_dequantize(torch.randn(ids.shape[0], 64, device=DEVICE))
    want = mxfp4_reference(x, *(t.to(DEVICE) for t in (gate_up, gate_up_scale, down, down_scale)), weights, ids, True)
    got = fused_experts(x, padded(gate_up, gate_up_scale, False), padded(down, down_scale, False), weights, ids,
                        quantize_inner=True, config=TAILED)
    assert_close(got, want)


def test_op_reads_strided_rows_and_picks_its_config():
    gate_up, down = random_experts(4, 64, 32, seed=5)
    weights, ids = random_routing(5, 2, 4, seed=6)
    x = torch.randn(5, 128, device=DEVICE)[:, ::2]
    assert_close(moe_experts(x, gate_up, down, weights, ids), reference(x, gate_up, down, weights, ids))


def test_no_tokens_give_an_empty_output():
    gate_up, down = random_experts(4, 64, 32, seed=7)
    ids = torch.empty(0, 2, dtype=torch.int64, device=DEVICE)
    out = moe_experts(torch.empty(0, 64, device=DEVICE), gate_up, down, torch.empty(0, 2, device=DEVICE), ids)
    assert out.shape == (0, 64)


def test_configs_the_mxfp4_kernels_cannot_take_are_refused():
    (gate_up, gate_up_scale), (down, down_scale) = random_mxfp4_experts(4, 64, 32, seed=1, wide=False)
    weights, ids = random_routing(2, 2, 4, seed=2)
    x = torch.randn(2, 64, device=DEVICE)
    narrow = MoeConfig(16, gate_up=ProjectionTiles(16, 32, 4, 2), down=ProjectionTiles(32, 32, 4, 2))
    with pytest.raises(ValueError, match="quantizes gelu.*32 columns.*block_n 16"):
        fused_experts(x, padded(gate_up, gate_up_scale, False), padded(down, down_scale, False), weights, ids,
                      quantize_inner=True, config=narrow)
    odd_k = MoeConfig(16, gate_up=ProjectionTiles(32, 48, 4, 2), down=ProjectionTiles(32, 32, 4, 2))
    with pytest.raises(ValueError, match="block_k 48"):
        fused_experts(x, padded(gate_up, gate_up_scale, False), padded(down, down_scale, False), weights, ids,
                      config=odd_k)


def test_config_tiles_grow_with_rows_per_expert():
    assert [pick_config(pairs, 128).block_m for pairs in (8, 256, 1024, 4096, 16384)] == [16, 16, 16, 32, 64]


def random_mxfp4_experts(num_experts: int, hidden: int, inner: int, seed: int, wide: bool):
    """(packed, scale) per projection as Quark stores them; blocks of very different magnitudes, so a scale applied
    to the wrong block shows; wide: scales above 2 too (the exact expansion)."""
    gen = torch.Generator().manual_seed(seed)
    projections = []
    for rows, k in ((2 * inner, hidden), (hidden, inner)):
        exponents = torch.randint(-6, 4 if wide else 0, (num_experts, rows, -(-k // 32)), generator=gen).float()
        w = torch.randn(num_experts, rows, k, generator=gen)
        projections.append(mxfp4.quantize(w * torch.exp2(exponents).repeat_interleave(32, dim=2)[..., :k]))
    return projections


def padded(packed: torch.Tensor, scale: torch.Tensor, wide: bool) -> ExpertWeights:
    """The Triton layout: each expert padded along K as MXFP4Experts.process_after_loading does."""
    experts = [pad_to_k_align(w, s) for w, s in zip(packed, scale)]
    stacked_scale = torch.stack([s for _, s in experts]).to(DEVICE)
    assert needs_wide_scales(stacked_scale) == wide
    return ExpertWeights(torch.stack([w for w, _ in experts]).to(DEVICE), stacked_scale, wide)


@pytest.mark.parametrize("tokens,top_k,num_experts,hidden,inner,config", [
    (1, 1, 4, 64, 32, SMALL),      # one token, one expert
    (1, 8, 16, 96, 48, SMALL),     # top 8; partial last 32-blocks along both K
    (9, 2, 8, 64, 64, DECODE),
    (40, 2, 4, 64, 64, MEDIUM),
])
@pytest.mark.parametrize("quantize_x", [True, False])
@pytest.mark.parametrize("wide", [False, True])
def test_fused_mxfp4_experts_match_the_per_expert_loop(tokens, top_k, num_experts, hidden, inner, config, quantize_x,
                                                       wide):
    (gate_up, gate_up_scale), (down, down_scale) = random_mxfp4_experts(num_experts, hidden, inner, tokens, wide)
    weights, ids = random_routing(tokens, top_k, num_experts, seed=tokens + 1)
    x = torch.randn(tokens, hidden, device=DEVICE)
    want = mxfp4_reference(x, *(t.to(DEVICE) for t in (gate_up, gate_up_scale, down, down_scale)), weights, ids,
                           quantize_x)
    xq = mxfp4.quantize_dequantize(x) if quantize_x else x
    got = fused_experts(xq, padded(gate_up, gate_up_scale, wide), padded(down, down_scale, wide), weights, ids,
                        quantize_inner=quantize_x, config=config)
    assert_close(got, want)


def test_mxfp4_op_quantizes_its_input_and_pads_nothing_itself():
    (gate_up, gate_up_scale), (down, down_scale) = random_mxfp4_experts(8, 64, 32, seed=9, wide=False)
    weights, ids = random_routing(6, 2, 8, seed=10)
    x = torch.randn(6, 64, device=DEVICE)
    gu, dn = padded(gate_up, gate_up_scale, False), padded(down, down_scale, False)
    got = mxfp4_moe_experts(x, gu.weight, gu.scale, dn.weight, dn.scale, weights, ids, True, False)
    want = mxfp4_reference(x, *(t.to(DEVICE) for t in (gate_up, gate_up_scale, down, down_scale)), weights, ids,
                           True)
    assert_close(got, want)


@pytest.mark.parametrize("platform,backend,graph_safe", [
    (Platform("cuda", "sm_90"), "triton", True), (Platform("rocm", "gfx942"), "triton", True),
    (Platform("cpu"), "torch", False)])
def test_experts_layer_is_graph_safe_on_the_fused_kernel_only(platform, backend, graph_safe):
    with dispatch.use(platform):
        experts = Experts(4, 64, 32)
    assert (experts.backend, experts.graph_safe) == (backend, graph_safe)
    assert ("syncs with the host" in experts.graph_unsafe_reason) == (not graph_safe)


def test_fused_moe_refuses_what_it_cannot_run():
    cuda = Platform("cuda", "sm_90")
    assert kernels.refusal("triton", "moe_experts", cuda, dict(experts=128, dtype=torch.bfloat16)) is None
    assert "1024 experts" in kernels.refusal("triton", "moe_experts", cuda, dict(experts=1024))
    assert "float64" in kernels.refusal("triton", "moe_experts", cuda, dict(experts=8, dtype=torch.float64))
