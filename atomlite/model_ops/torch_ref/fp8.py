"""The FP8 linear and experts as the layers call them (dispatch's fp8_linear and fp8_moe_experts), on the
dequantizing reference: the checkpoint's semantics (quant.fp8) in float32; nothing is prepared at load."""
import torch

from atomlite.model_ops.kernels import declare
from atomlite.model_ops.torch_ref.moe import LOOP_REASON, route_to_experts
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec


class ReferenceFP8Linear:
    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec):
        """-> (weight, scale, what else the kernels keep); the reference keeps the checkpoint's tensors."""
        return weight, scale, None

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
               prepared: None, spec: FP8Spec, summed: bool = True) -> torch.Tensor:
        """summed=False lets a kernel return its split-K slices unsummed; the reference always sums."""
        return fp8.gemm(x, weight, scale, spec, input_scale)


class ReferenceFP8Experts:
    def prepare_weights(self, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                        down_scale: torch.Tensor, spec: FP8Spec):
        return gate_up, gate_up_scale, down, down_scale, None

    def experts(self, x: torch.Tensor, weights: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                topk_weights: torch.Tensor, topk_ids: torch.Tensor, prepared: None, spec: FP8Spec,
                summed: bool = True) -> torch.Tensor:
        """weights: "gate_up_proj" / "down_proj" -> (weight [E, N, K], scale [E, N, G], input_scale [E] or None),
        each expert with its own input scale. summed=False lets a kernel return the slots unsummed; the reference
        always sums."""
        def project(rows: torch.Tensor, name: str, expert: int) -> torch.Tensor:
            weight, scale, input_scale = weights[name]
            own = None if input_scale is None else input_scale[expert]
            return fp8.gemm(rows, weight[expert], scale[expert], spec, own)
        return route_to_experts(x, topk_weights, topk_ids, project)


FP8_LINEAR = ReferenceFP8Linear()
FP8_EXPERTS = ReferenceFP8Experts()


declare("fp8_linear", "torch", FP8_LINEAR)
declare("fp8_moe_experts", "torch", FP8_EXPERTS, graph_unsafe=LOOP_REASON)
