import torch
import torch.nn.functional as F


def moe_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
    """sum_k w_k * down_e(gelu_tanh(gate_e x) * up_e x) for e = topk_ids[:, k].

    x [T, H]; gate_up [E, 2I, H] (gate rows first); down [E, H, I]; topk_* [T, K].
    """
    out = torch.zeros_like(x)
    for expert in topk_ids.unique().tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        gate, up = F.linear(x[token_idx], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.gelu(gate, approximate="tanh") * up, down[expert])
        out.index_add_(0, token_idx, (y * topk_weights[token_idx, slot, None]).to(out.dtype))
    return out
