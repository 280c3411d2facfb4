"""The MoE router's top-k in one launch per step: softmax, top k, renormalization and per-expert scales, which
torch runs as about seven launches (softmax, two for top-k, sum, division, gather, product)."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel


@triton.jit
def _router_topk_kernel(scores, expert_scale, weights, ids, num_experts, stride_s,
                        TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program per token. Renormalized over the chosen k, the softmax over all experts is the softmax over
    the k alone: exp(s - max) / sum over the k."""
    row = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    s = tl.load(scores + row * stride_s + experts, mask=experts < num_experts, other=float("-inf")).to(tl.float32)
    slots = tl.arange(0, BLOCK_K)
    chosen = tl.full([BLOCK_K], float("-inf"), dtype=tl.float32)
    chosen_ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(TOP_K):  # the largest left, the lowest index among equals
        best = tl.max(s, 0)
        best_id = tl.min(tl.where(s == best, experts, BLOCK_E), 0)
        chosen = tl.where(slots == k, best, chosen)
        chosen_ids = tl.where(slots == k, best_id, chosen_ids)
        s = tl.where(experts == best_id, float("-inf"), s)
    used = slots < TOP_K
    e = tl.where(used, tl.exp(chosen - tl.max(chosen, 0)), 0.0)
    scale = tl.load(expert_scale + chosen_ids, mask=used, other=0.0).to(tl.float32)
    tl.store(weights + row * TOP_K + slots, e / tl.sum(e, 0) * scale, mask=used)
    tl.store(ids + row * TOP_K + slots, chosen_ids.to(tl.int64), mask=used)


def router_topk(scores: torch.Tensor, expert_scale: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as torch_ref.router_topk."""
    num_tokens, num_experts = scores.shape
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=scores.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=scores.device)
    if num_tokens:
        if scores.stride(1) != 1:
            scores = scores.contiguous()
        run_kernel(_router_topk_kernel, (num_tokens,), scores, expert_scale, weights, ids, num_experts,
                   scores.stride(0), TOP_K=top_k, BLOCK_K=triton.next_power_of_2(top_k),
                   BLOCK_E=triton.next_power_of_2(num_experts), num_warps=4)
    return weights, ids
