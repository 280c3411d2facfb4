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
