"""MoE experts with FP8 weights, as compressed-tensors and Quark export them: one Linear per expert and projection
(experts.E.{gate,up,down}_proj.{weight,weight_scale,input_scale}), stacked here (gate rows first). Each expert keeps
its own weight scales and, for static activations, its own input scales (no max over experts)."""
import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import PartialSums, TokenQuantization, TokenRows
from atomlite.model_ops.fp8_linear import DUMMY_INPUT_SCALE, DUMMY_WEIGHT_SCALE, load_fp8_weight, scale_rows
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec


class FP8Experts(nn.Module):
    """gate_up_proj [E, 2I, H] e4m3 + gate_up_proj_scale [E, 2I, G]; down_proj [E, H, I] + down_proj_scale
    [E, H, G'] (atomlite's scale layout, quant.fp8); static input scales [E, 2] and [E, 1]. Shard s of gate_up is
    expert s // 2, gate (even) or up (odd); shard e of down is expert e."""
    routed_experts = True

    def __init__(self, num_experts: int, hidden: int, intermediate: int, spec: FP8Spec):
        super().__init__()
        self.num_experts, self.params_per_expert = num_experts, 3 * hidden * intermediate
        self.top_k: int | None = None  # experts per token, set by the model (roofline accounting)
        self.spec, self.intermediate = spec, intermediate
        # name: (rows, K, checkpoint tensors per expert)
        self._shapes = {"gate_up_proj": (2 * intermediate, hidden, 2), "down_proj": (hidden, intermediate, 1)}
        for name, (rows, k, per_expert) in self._shapes.items():
            self._param(name, torch.empty(num_experts, rows, k, dtype=fp8.E4M3_DTYPE), per_expert)
            scale = self._param(f"{name}_scale", torch.empty(num_experts, rows, spec.scale_columns(k)), per_expert)
            scale.dummy_fill = DUMMY_WEIGHT_SCALE
            if spec.static_input:
                self._param(f"{name}_input_scale", torch.ones(num_experts, per_expert), per_expert).dummy_fill = \
                    DUMMY_INPUT_SCALE
        self.kernel = dispatch.choose("fp8_moe_experts", experts=num_experts, dtype=torch.get_default_dtype(),
                                      weight=spec.weight, activation=spec.activation, block_k=spec.block_k,
                                      group_size=spec.group_size)
        self.backend, self._family = self.kernel.backend, self.kernel.fn
        self.graph_safe, self.graph_unsafe_reason = self.kernel.graph_safe, self.kernel.graph_unsafe_reason or ""
        self.prepared = None
        self.returns_partial_sums = False

    def _param(self, name: str, data: torch.Tensor, per_expert: int) -> nn.Parameter:
        param = nn.Parameter(data, requires_grad=False)
        param.weight_loader, param.num_shards = self._load_shard, self.num_experts * per_expert
        param.stacked_name = name
        setattr(self, name, param)
        return param

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: int | None = None) -> None:
        if shard is None:
            raise ValueError("is one tensor for all experts, but this checkpoint's quantization_config quantizes the "
                             "experts: atomlite reads fp8 experts as per-expert tensors (experts.E.gate_proj...)")
        base = param.stacked_name.removesuffix("_input_scale").removesuffix("_scale")
        rows, k, per_expert = self._shapes[base]
        expert, part = divmod(shard, per_expert)
        size = rows // per_expert
        if param.stacked_name.endswith("_input_scale"):
            if loaded.numel() != 1:
                raise ValueError(f"input_scale has shape {tuple(loaded.shape)}; a static per-tensor scale is one "
                                 f"value")
            param.data[expert, part] = loaded.float().reshape(())
        elif param.stacked_name.endswith("_scale"):
            param.data[expert, part * size:(part + 1) * size] = scale_rows(loaded, self.spec, size, k)
        else:
            load_fp8_weight(param[expert, part * size:(part + 1) * size], loaded)

    def process_after_loading(self) -> None:
        if self.spec.static_input:  # gate and up read one input: one scale per expert (they agree)
            for name in self._shapes:
                param = getattr(self, f"{name}_input_scale")
                param.data = param.data.amax(dim=1)
        params = (self.gate_up_proj, self.gate_up_proj_scale, self.down_proj, self.down_proj_scale)
        *tensors, self.prepared = self._family.prepare_weights(*(p.data for p in params), self.spec)
        for param, tensor in zip(params, tensors):
            param.data = tensor

    def can(self, capability: str) -> bool:
        if capability == "reads_token_rows" and self.spec.activation != "token":
            return False
        return self.kernel.can(capability)

    def input_quantization(self, x: torch.Tensor) -> TokenQuantization:
        """For the kernel that computes the experts' input x (linked where they read TokenRows): per token, in the
        weights' e4m3, once for all of a token's experts (dynamic scales are the token's)."""
        return TokenQuantization(self.gate_up_proj.dtype)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms

    def forward(self, x: "torch.Tensor | TokenRows", topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor | PartialSums:
        """Linked to a consumer that reads them (model_ops.fusion), the output may be PartialSums, one per slot;
        linked to a kernel before that writes them, x may come quantized per token (TokenRows)."""
        weights = {name: (getattr(self, name), getattr(self, f"{name}_scale"),
                          getattr(self, f"{name}_input_scale", None)) for name in self._shapes}
        return self._family.experts(x, weights, topk_weights, topk_ids, self.prepared, self.spec,
                                    summed=not self.returns_partial_sums)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, intermediate={self.intermediate}, {self.spec.describe()}, "
                f"backend={self.backend}")
