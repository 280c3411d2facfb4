"""MoE experts with MXFP4 weights, as Quark exports them: one packed Linear per expert and projection
(experts.E.{gate,up,down}_proj.{weight,weight_scale}), stacked here like the float experts (gate rows first)."""
import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.mxfp4_linear import load_exact
from atomlite.model_ops.sharding import ReducesOutput
from atomlite.quant.quark import LinearQuantSpec


class MXFP4Experts(nn.Module):
    """gate_up_proj [E, 2I, H/2] + gate_up_proj_scale [E, 2I, ceil(H/32)]; down_proj [E, H, I/2] + down_proj_scale
    [E, H, ceil(I/32)] (Quark pads a partial last 32-block). Shard s of gate_up is expert s // 2, gate (even) or up
    (odd); shard e of down is expert e. Built under the model's default dtype, which picks the kernel family
    (mxfp4_moe_experts); it lays the weights out for its kernels in process_after_loading."""
    routed_experts = True

    def __init__(self, num_experts: int, hidden: int, intermediate: int, spec: LinearQuantSpec):
        super().__init__()
        self.num_experts, self.params_per_expert = num_experts, 3 * hidden * intermediate
        self.top_k: int | None = None  # experts per token, set by the model (roofline accounting)
        for features in (hidden, intermediate):
            if features % 2:
                raise ValueError(f"MXFP4 experts need even sizes (two e2m1 codes per byte), got {features}")
        self.spec, self.intermediate = spec, intermediate
        # name: (rows, K, checkpoint tensors per expert)
        shapes = {"gate_up_proj": (2 * intermediate, hidden, 2), "down_proj": (hidden, intermediate, 1)}
        for name, (rows, k, per_expert) in shapes.items():
            shards = num_experts * per_expert
            self._packed_param(name, (num_experts, rows, k // 2), shards)
            self._packed_param(f"{name}_scale", (num_experts, rows, -(-k // spec.block_size)), shards)
        self.kernel = dispatch.choose("mxfp4_moe_experts", experts=num_experts, dtype=torch.get_default_dtype(),
                                      dynamic_input=spec.dynamic_fp4_input)
        self.backend, self._family = self.kernel.backend, self.kernel.fn
        self.graph_safe, self.graph_unsafe_reason = self.kernel.graph_safe, self.kernel.graph_unsafe_reason or ""
        self.prepared = None  # what the family's prepare_weights made besides the tensors kept as parameters
        self.returns_partial_sums = False

    def _packed_param(self, name: str, shape: tuple[int, ...], shards: int) -> None:
        param = nn.Parameter(torch.empty(shape, dtype=torch.uint8), requires_grad=False)
        param.weight_loader, param.num_shards = self._load_shard, shards
        setattr(self, name, param)

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: int | None = None) -> None:
        if shard is None:
            raise ValueError("is one tensor for all experts, but this checkpoint's quantization_config quantizes the "
                             "experts: quantize with Quark's preprocess_for_quantization (per-expert MXFP4 "
                             "tensors), or exclude the experts in quantization_config")
        per_expert = param.num_shards // param.shape[0]
        expert, part = divmod(shard, per_expert)
        rows = param.shape[1] // per_expert
        load_exact(param[expert, part * rows:(part + 1) * rows], loaded)

    def process_after_loading(self) -> None:
        params = (self.gate_up_proj, self.gate_up_proj_scale, self.down_proj, self.down_proj_scale)
        *tensors, self.prepared = self._family.prepare_weights(*(param.data for param in params))
        for param, tensor in zip(params, tensors):
            param.data = tensor

    def can(self, capability: str) -> bool:
        return self.kernel.can(capability)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor | PartialSums:
        """Linked to a consumer that reads them (model_ops.fusion), the output may be PartialSums, one per slot."""
        return self._family.experts(x, self.gate_up_proj, self.gate_up_proj_scale, self.down_proj,
                                    self.down_proj_scale, topk_weights, topk_ids, self.prepared,
                                    self.spec.dynamic_fp4_input, summed=not self.returns_partial_sums)

    def extra_repr(self) -> str:
        return f"experts={self.gate_up_proj.shape[0]}, intermediate={self.intermediate}, backend={self.backend}"


class ShardedMXFP4Experts(ReducesOutput, MXFP4Experts):
    """MXFP4Experts holding a slice of the intermediate size, on 32-element block boundaries: the output is
    all-reduced."""

    @property
    def out_features(self) -> int:
        return self.down_proj.shape[1]
