"""The MoE router's top-k (softmax, top k, renormalization, per-expert scales) in one Triton launch, against the
torch reference: the interpreter on CPU, compiled on a GPU."""
import pytest
import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops import triton as tri
from test_triton_attention import DEVICE


def distinct_scores(tokens: int, experts: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Logits without ties (each row a shuffled ramp), so the chosen experts are one set in any order of search."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(experts, generator=gen).float() * 0.05 - 3.0 for _ in range(tokens)]
    return torch.stack(rows).to(dtype).to(DEVICE)


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 128, 8), (33, 128, 8), (5, 100, 6), (3, 16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_topk_matches_the_reference(tokens, experts, top_k, dtype):
    scores = distinct_scores(tokens, experts, dtype, seed=tokens)
    scale = (torch.rand(experts, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype).to(DEVICE)
    weights, ids = tri.router_topk(scores, scale, top_k)
    want_weights, want_ids = torch_ref.router_topk(scores, scale, top_k)
    assert ids.dtype == want_ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, want_ids)  # both in descending order of probability
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)


def test_equal_logits_go_to_the_lowest_expert_first():
    scores = torch.tensor([[0.5, 2.0, 2.0, -1.0, 2.0, 0.0]], device=DEVICE)
    weights, ids = tri.router_topk(scores, torch.ones(6, device=DEVICE), 2)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5]], device=DEVICE))


def test_no_tokens_gives_empty_routing():
    weights, ids = tri.router_topk(torch.empty(0, 128, device=DEVICE), torch.ones(128, device=DEVICE), 8)
    assert weights.shape == ids.shape == (0, 8)


def exact_router_inputs(tokens: int, experts: int, hidden: int, seed: int):
    """x in {-1, 0, 1} (half of it 0) and weights in {-2, ..., 2} / 8: every logit is a multiple of 1/8 well inside
    (-32, 32), exact in fp32 whatever order its terms are added in and exact in bf16, so the fused kernel and the
    reference pick from the same logits, ties included (the interpreter truncates where a GPU rounds)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, (tokens, hidden), generator=gen) * (torch.rand(tokens, hidden, generator=gen) < 0.5)
    x = x.to(torch.bfloat16)
    weight = (torch.randint(-2, 3, (experts, hidden), generator=gen) / 8).to(torch.bfloat16)
    scale = (torch.rand(experts, generator=gen) + 0.5).to(torch.bfloat16)
    return x.to(DEVICE), weight.to(DEVICE), scale.to(DEVICE)


def lowest_index_first_routing(x, weight, scale, top_k):
    """The reference router on the exactly computed logits, equal logits taken lowest expert first."""
    logits = (x.float() @ weight.float().T).to(x.dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = probs.gather(1, ids)
    return chosen / chosen.sum(dim=-1, keepdim=True) * scale[ids], ids


@pytest.mark.parametrize("tokens,experts,hidden,top_k", [
    (1, 128, 2816, 8),  # 26B-A4B at batch 1: 22 K slices
    (2, 128, 2816, 8),
    (2, 64, 4352, 2),  # more K tiles than slices: each slice walks several
    (2, 100, 256, 6),  # experts no multiple of 64, and 3 tokens: the GEMM and router_topk run apart
    (3, 128, 256, 1)])
def test_one_launch_router_matches_the_reference(tokens, experts, hidden, top_k):
    x, weight, scale = exact_router_inputs(tokens, experts, hidden, seed=tokens + hidden)
    want_weights, want_ids = lowest_index_first_routing(x, weight, scale, top_k)
    assert (x.float() @ weight.float().T).abs().max() < 32
    for _ in range(2):  # the second launch finds the arrival counter the first one left at zero
        weights, ids = tri.router(x, weight, scale, top_k)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)

