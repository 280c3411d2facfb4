import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.linear import copy_weight
from atomlite.model_ops.sharding import ReducesOutput


class Experts(nn.Module):
    """Stacked expert MLPs: gate_up_proj [E, 2I, H] (gate first), down_proj [E, H, I]. Built under the model's
    default dtype, which picks the kernel; graph_safe says whether that kernel can be captured in a graph."""
    routed_experts = True

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts, self.params_per_expert = num_experts, 3 * hidden * intermediate
        self.top_k: int | None = None  # experts per token, set by the model (roofline accounting)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate), requires_grad=False)
        self.gate_up_proj.weight_loader = copy_weight
        self.down_proj.weight_loader = copy_weight
        self.kernel = dispatch.choose("moe_experts", experts=num_experts, dtype=torch.get_default_dtype())
        self._fn, self.backend = self.kernel.fn, self.kernel.backend
        self.graph_safe, self.graph_unsafe_reason = self.kernel.graph_safe, self.kernel.graph_unsafe_reason or ""
        self.returns_partial_sums = False

    def forward(self, x, topk_weights, topk_ids):
        """Linked to a consumer that reads them (model_ops.fusion), the output may be PartialSums, one per slot."""
        return self._fn(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids,
                        summed=not self.returns_partial_sums)

    def can(self, capability: str) -> bool:
        return self.kernel.can(capability)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, backend={self.backend}"


class ShardedExperts(ReducesOutput, Experts):
    """Experts holding a slice of the intermediate size (gate, up and down alike): the output is all-reduced."""

    @property
    def out_features(self) -> int:
        return self.down_proj.shape[1]
