"""The FP8 linear and experts as layers call them (dispatch's fp8_linear, fp8_moe_experts) on the Triton GEMMs:
weights converted at load to the platform's e4m3 (fnuz on gfx942, scales doubled); activations quantized, then
fp8 GEMMs."""
import torch

from atomlite.model_ops.kernels import declare
from atomlite.model_ops.carriers import PartialSums, TokenRows
from atomlite.model_ops.triton.common import is_power_of_two, platform_of
from atomlite.model_ops.triton.fp8 import tuning
from atomlite.model_ops.triton.fp8.gemm import (fp8_gemm, gemm_on_rows, library_takes_block_scales,
                                                library_takes_row_scales)
from atomlite.model_ops.triton.fp8.moe import fp8_experts
from atomlite.model_ops.triton.fp8.quant import quantizes_gated_cheaply
from atomlite.model_ops.triton.moe.routing import MAX_EXPERTS
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec


def on_platform(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fnuz on gfx942 (scales doubled), contiguous, scales in fp32."""
    if platform_of(weight.device).fp8_dtype == fp8.E4M3FNUZ_DTYPE:
        weight, scale = fp8.to_e4m3fnuz(weight, scale)
    return weight.contiguous(), scale.float().contiguous()


class TritonFP8Linear:
    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec):
        """Block scales [N, K / 128] are stored with unit stride along N: the GEMM's K step reads BLOCK_N of them
        together, and cuBLAS's 1x128 block scaling takes them so (gemm.library_block_mm)."""
        weight, scale = on_platform(weight, scale)
        if scale.shape[1] > 1:
            scale = scale.t().contiguous().t()
        if weight.is_cuda:  # asked now, never inside a graph capture
            library_takes_row_scales(weight.device, weight.dtype)
            library_takes_block_scales(weight.device)
        return weight, scale, None

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
               prepared: None, spec: FP8Spec, summed: bool = True) -> torch.Tensor | PartialSums:
        return fp8_gemm(x, weight, scale, input_scale, spec.activation, spec.group_size, spec.block_k, summed)

    def takes_gated(self, rows: int, k: int, spec: FP8Spec, device: torch.device) -> bool:
        return quantizes_gated_cheaply(rows, k, spec.activation, device)

    def matmul_gated(self, gate_up: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     input_scale: torch.Tensor | None, prepared: None, spec: FP8Spec,
                     summed: bool = True) -> torch.Tensor | PartialSums:
        """The GEMM on gelu_tanh(gate) * up of gate_up = [gate | up], computed as it is quantized."""
        return fp8_gemm(gate_up, weight, scale, input_scale, spec.activation, spec.group_size, spec.block_k, summed,
                        gated=True)

    def matmul_token_rows(self, x: TokenRows, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec,
                          summed: bool = True) -> torch.Tensor | PartialSums:
        """The GEMM on x that the kernel before quantized per token (TokenRows)."""
        return gemm_on_rows(x.values, x.scales, weight, scale, spec.block_k, x.dtype, summed)


FP8_LINEAR = TritonFP8Linear()


class TritonFP8Experts:
    """The experts as two grouped GEMMs (gate_up, then down on gelu_tanh(gate) * up, weighted per pair) and the
    sum over each token's slots (moe.fp8_experts)."""

    def prepare_weights(self, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                        down_scale: torch.Tensor, spec: FP8Spec):
        (gate_up, gate_up_scale), (down, down_scale) = (
            on_platform(w, s) for w, s in ((gate_up, gate_up_scale), (down, down_scale)))
        return gate_up, gate_up_scale, down, down_scale, None

    def experts(self, x: "torch.Tensor | TokenRows", weights: dict, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                prepared: None, spec: FP8Spec, summed: bool = True) -> torch.Tensor | PartialSums:
        return fp8_experts(x, weights["gate_up_proj"], weights["down_proj"], topk_weights, topk_ids,
                           spec.activation, spec.group_size, spec.block_k, summed=summed)


FP8_EXPERTS = TritonFP8Experts()


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("experts", 0) > MAX_EXPERTS:
        return f"{shape['experts']} experts exceed {MAX_EXPERTS}"
    if not platform.has_fp8:
        return f"{platform.arch} has no fp8 tensor cores"
    block_k, group = shape.get("block_k", 0), shape.get("group_size", 128)
    step = tuning.SCALE_K_STEP
    if shape.get("activation") == "group":
        if not is_power_of_two(group) or group < step:
            return f"activation group {group} is not a power of two >= {step} (the GEMM's K step)"
        if block_k and block_k % group:
            return f"activation group {group} does not divide the weight's {block_k}-wide scale blocks"
    elif block_k and (block_k < step or not is_power_of_two(block_k)):
        return f"weight scale blocks of {block_k} along K are not a power of two >= {step} (the GEMM's K step)"
    return None


# fp8 GEMM with the checkpoint's activation quantization fused in
# reads_token_rows where the layer's activations are dynamic per token, reads_gated_input where they are quantized
# at all (FP8Linear.can)
declare("fp8_linear", "triton", FP8_LINEAR, refuses=_refuses, tuning=tuning,
        capabilities={"writes_partial_sums", "reads_token_rows", "reads_gated_input"})
# the same as a grouped GEMM over expert-sorted blocks (a few pairs: one per block): capture-safe; reads_token_rows
# where the experts' activations are dynamic per token (FP8Experts.can)
declare("fp8_moe_experts", "triton", FP8_EXPERTS, refuses=_refuses, tuning=tuning,
        capabilities={"writes_partial_sums", "reads_token_rows"})
