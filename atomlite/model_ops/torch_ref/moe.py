import torch
import torch.nn.functional as F

from atomlite.model_ops.torch_ref.mxfp4 import mxfp4_gemm
from atomlite.model_ops.kernels import declare


def moe_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, summed: bool = True) -> torch.Tensor:
    """sum_k w_k * down_e(gelu_tanh(gate_e x) * up_e x) for e = topk_ids[:, k].

    x [T, H]; gate_up [E, 2I, H] (gate rows first); down [E, H, I]; topk_* [T, K]. summed=False lets a kernel
    return the k terms unsummed (PartialSums); the reference always sums.
    """
    weights = {"gate_up_proj": gate_up, "down_proj": down}
    return route_to_experts(x, topk_weights, topk_ids, lambda rows, name, e: F.linear(rows, weights[name][e]))


def mxfp4_moe_experts(x: torch.Tensor, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                      down_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, quantize_x: bool,
                      wide_scales: bool = True, summed: bool = True) -> torch.Tensor:
    """moe_experts with MXFP4 weights: gate_up [E, 2I, H/2] + e8m0 [E, 2I, ceil(H/32)], down [E, H, I/2] +
    [E, H, ceil(I/32)] (packed as mxfp4.quantize does). quantize_x: each projection's input is MXFP4
    quantize-dequantized first. wide_scales and summed are for the Triton kernels, unused here."""
    weights = {"gate_up_proj": (gate_up, gate_up_scale), "down_proj": (down, down_scale)}

    def project(rows: torch.Tensor, name: str, expert: int) -> torch.Tensor:
        weight, scale = weights[name]
        return mxfp4_gemm(rows, weight[expert], scale[expert], quantize_x)
    return route_to_experts(x, topk_weights, topk_ids, project)


def route_to_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, project) -> torch.Tensor:
    """The expert loop of every MoE layout: project(rows, "gate_up_proj" | "down_proj", expert) applies one
    expert's projection to its tokens' rows; outputs are weighted and summed per token."""
    out = torch.zeros_like(x)
    for expert in topk_ids.unique().tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        gate, up = project(x[token_idx], "gate_up_proj", expert).chunk(2, dim=-1)
        y = project(F.gelu(gate, approximate="tanh") * up, "down_proj", expert)
        out.index_add_(0, token_idx, (y * topk_weights[token_idx, slot, None]).to(out.dtype))
    return out


LOOP_REASON = "experts run as a per-expert loop that syncs with the host"
declare("moe_experts", "torch", moe_experts, graph_unsafe=LOOP_REASON)
