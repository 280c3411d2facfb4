"""The few-pairs bf16 experts as skinny GEMMs (triton.moe_skinny; on CPU under TRITON_INTERPRET=1) against the
per-expert torch loop in fp32 on the same bf16 weights."""
import pytest
import torch

from helpers import assert_same_rounded_sum

from atomlite.model_ops.partial_sums import PartialSums, summed
from atomlite.model_ops.torch_ref.moe import moe_experts as reference
from atomlite.model_ops.triton import moe_gemm, moe_skinny
from atomlite.model_ops.triton.moe_common import ExpertWeights
from atomlite.model_ops.triton.moe_skinny import SkinnyExpertsConfig, SkinnyTiles, fits, skinny_experts
from test_moe_gemm import DEVICE, random_experts, random_routing

# several feature blocks and K steps in each projection at these shapes
SMALL = SkinnyExpertsConfig(SkinnyTiles(32, 64, 4, 2), SkinnyTiles(32, 32, 4, 2))


def bf16_case(tokens, top_k, num_experts, hidden, inner, seed):
    gate_up, down = (w.to(torch.bfloat16) for w in random_experts(num_experts, hidden, inner, seed=seed))
    weights, ids = random_routing(tokens, top_k, num_experts, seed=seed + 1)
    x = torch.randn(tokens, hidden, device=DEVICE).to(torch.bfloat16)
    want = reference(x.float(), gate_up.float(), down.float(), weights, ids)
    return x, gate_up, down, weights, ids, want


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("tokens,top_k,num_experts", [
    (1, 1, 4),    # one token, one expert
    (1, 8, 16),   # top 8
    (3, 2, 4),    # experts repeat across tokens
])
def test_skinny_experts_match_the_per_expert_loop(tokens, top_k, num_experts):
    x, gate_up, down, weights, ids, want = bf16_case(tokens, top_k, num_experts, 128, 64, seed=tokens * top_k)
    got = skinny_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, SMALL)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    assert rel_err(got, want) < 1e-2  # bf16: the inner activations and the output are rounded


def test_unsummed_slots_add_up_to_the_summed_output():
    x, gate_up, down, weights, ids, want = bf16_case(2, 4, 8, 128, 64, seed=5)
    args = (x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, SMALL)
    slots = skinny_experts(*args, summed=False)
    assert isinstance(slots, PartialSums) and slots.parts.shape == (4, 2, 128)
    assert_same_rounded_sum(summed(slots), skinny_experts(*args))


def test_the_op_takes_skinny_experts_for_bf16_on_the_tiles_only():
    gate_up, down = (w.to(torch.bfloat16) for w in random_experts(4, 256, 64, seed=7))
    x = torch.randn(1, 256, device=DEVICE).to(torch.bfloat16)
    assert fits(x, ExpertWeights(gate_up), ExpertWeights(down))
    assert not fits(x.float(), ExpertWeights(gate_up.float()), ExpertWeights(down.float()))  # fp32: moe_gemv
    odd_inner = random_experts(4, 256, 48, seed=8)[1].to(torch.bfloat16)  # 48 is no multiple of down's 64
    assert not fits(x, ExpertWeights(torch.empty(4, 96, 256, dtype=torch.bfloat16, device=DEVICE)),
                    ExpertWeights(odd_inner))


def test_the_moe_op_routes_few_bf16_pairs_here(monkeypatch):
    x, gate_up, down, weights, ids, want = bf16_case(1, 2, 4, 256, 64, seed=9)
    calls, run = [], moe_skinny.skinny_experts
    monkeypatch.setattr(moe_skinny, "skinny_experts", lambda *a, **kw: (calls.append(1), run(*a, **kw))[1])
    got = moe_gemm.moe_experts(x, gate_up, down, weights, ids)
    assert calls and rel_err(got, want) < 1e-2
