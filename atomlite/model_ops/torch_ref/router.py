import torch
from atomlite.model_ops.kernels import declare


def router_topk(scores: torch.Tensor, expert_scale: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] fp32, ids [T, k] int64): the k most probable experts (softmax over
    all E), their probabilities renormalized over the k, times each chosen expert's scale (Gemma 4's router)."""
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * expert_scale[ids], ids


def router(x: torch.Tensor, weight: torch.Tensor, expert_scale: torch.Tensor,
           top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] and the router's weight [E, H] -> router_topk of the logits x W^T (rounded to x's dtype)."""
    return router_topk(torch.nn.functional.linear(x, weight), expert_scale, top_k)


declare("router_topk", "torch", router_topk)
declare("router", "torch", router)
