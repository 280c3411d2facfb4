"""The MXFP4 linear and experts as the layers call them (dispatch's mxfp4_linear and mxfp4_moe_experts), on the
dequantizing reference: the weights stay as the checkpoint stores them; nothing is prepared at load."""
import torch

from atomlite.model_ops.kernels import declare
from atomlite.model_ops.torch_ref.moe import LOOP_REASON, mxfp4_moe_experts
from atomlite.model_ops.torch_ref.mxfp4 import mxfp4_gemm


class ReferenceMXFP4Linear:
    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return weight, scale, None

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, prepared: None, quantize_x: bool,
               summed: bool = True) -> torch.Tensor:
        return mxfp4_gemm(x, weight, scale, quantize_x)


class ReferenceMXFP4Experts:
    def prepare_weights(self, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                        down_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                           None]:
        return gate_up, gate_up_scale, down, down_scale, None

    def experts(self, x: torch.Tensor, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                down_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, prepared: None,
                quantize_x: bool, summed: bool = True) -> torch.Tensor:
        return mxfp4_moe_experts(x, gate_up, gate_up_scale, down, down_scale, topk_weights, topk_ids, quantize_x)


MXFP4_LINEAR = ReferenceMXFP4Linear()
MXFP4_EXPERTS = ReferenceMXFP4Experts()


declare("mxfp4_linear", "torch", MXFP4_LINEAR,
        graph_unsafe="copies its FP4 value table from the host at every call")
declare("mxfp4_moe_experts", "torch", MXFP4_EXPERTS, graph_unsafe=LOOP_REASON)
