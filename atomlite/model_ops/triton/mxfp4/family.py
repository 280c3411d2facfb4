"""The MXFP4 linear and experts on Triton as the layers call them (dispatch's mxfp4_linear and mxfp4_moe_experts):
the weights laid out once at load (K padded to K_ALIGN, and what their scales allow: ScaleFacts), then the GEMMs,
with the capabilities the ops table declares for them: quantized rows in, a gated input, partial sums out."""
import dataclasses
from dataclasses import dataclass

import torch

from atomlite.model_ops.carriers import InputQuantization, PartialSums, QuantizedRows
from atomlite.model_ops.triton.moe.gemm import mxfp4_moe_experts
from atomlite.model_ops.triton.mxfp4.fp8_tiles import quantized_fp8_gemm
from atomlite.model_ops.triton.mxfp4.gemm import (K_ALIGN, gated_path, input_quantization, mxfp4_gemm,
                                                  needs_wide_scales, pad_to_k_align)
from atomlite.model_ops.triton.mxfp4.lookup import scale_bytes_fit
from atomlite.model_ops.triton.mxfp4.row_copy import RowCopy, copy_bytes, make_row_copy, row_copy_gemm, runs_copy
from atomlite.model_ops.triton.mxfp4.row_copy import supported as row_copy_supported
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.triton.common import platform_of
from atomlite.model_ops.triton.moe import tuning as moe_tuning
from atomlite.model_ops.triton.moe.gemm import refuses_experts
from atomlite.model_ops.triton.mxfp4 import tuning


@dataclass(frozen=True, slots=True)
class ScaleFacts:
    """What load time learns of a weight's e8m0 scales, and makes of them; each default is always right, the other
    value faster."""
    wide_scales: bool = True  # needs_wide_scales: a scale above 2 needs the exact expansion
    lookup_scales: bool = False  # scale_bytes_fit: the lookup kernel takes this weight
    row_copy: RowCopy | None = None  # row_copy.make_row_copy: many rows of quantized x multiply it at fp8 rate


UNCHECKED = ScaleFacts()


class TritonMXFP4Linear:
    """y = x W^T on the packed weight (mxfp4_gemm picks the kernel per call), or on its row copy from
    ROW_COPY_MIN_ROWS rows where load made one."""

    ROW_COPY_MIN_ROWS = tuning.ROW_COPY_MIN_M

    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    ScaleFacts]:
        weight, scale = pad_to_k_align(weight, scale)
        return weight, scale, ScaleFacts(needs_wide_scales(scale), scale_bytes_fit(weight, scale))

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, facts: ScaleFacts | None,
               quantize_x: bool, summed: bool = True) -> torch.Tensor | PartialSums:
        facts = facts or UNCHECKED
        if x.stride(-1) != 1:
            x = x.contiguous()
        if quantize_x and facts.row_copy is not None and x.dtype == torch.bfloat16 and runs_copy(x.shape[0]):
            return row_copy_gemm(x, facts.row_copy)
        return mxfp4_gemm(x, weight, scale, quantize_x, facts.wide_scales, lookup_scales=facts.lookup_scales,
                          summed=summed)

    def copies_rows(self, weight: torch.Tensor, quantize_x: bool, platform: Platform | None = None) -> bool:
        """Whether this weight may get a row copy (with_row_copy): MXFP4-quantized activations on a GPU whose fp8
        tensor cores the copy's GEMMs use (platform, default the weight's)."""
        return quantize_x and row_copy_supported(platform or platform_of(weight.device))

    def row_copy_bytes(self, weight: torch.Tensor) -> int:
        """What the copy of this weight takes, as loaded or before load (K then padded as prepare_weights pads it)."""
        return copy_bytes(weight.shape[0], -(-weight.shape[1] * 2 // K_ALIGN) * K_ALIGN)

    def with_row_copy(self, weight: torch.Tensor, scale: torch.Tensor, facts: ScaleFacts | None) -> ScaleFacts:
        """facts with the weight's row copy, where its scales allow one (row_copy.make_row_copy)."""
        return dataclasses.replace(facts or UNCHECKED, row_copy=make_row_copy(weight, scale))

    def input_quantization(self, x: torch.Tensor, weight: torch.Tensor, facts: ScaleFacts | None,
                           quantize_x: bool) -> InputQuantization | None:
        """The form in which the kernel computing x (2-D) may write it quantized, where this call runs the fp8
        tiles; else None."""
        if not quantize_x or x.dim() != 2:
            return None
        return input_quantization(x.shape[0], weight, x, True, (facts or UNCHECKED).lookup_scales)

    def matmul_quantized(self, x: QuantizedRows, weight: torch.Tensor, scale: torch.Tensor,
                         summed: bool = True) -> torch.Tensor | PartialSums:
        return quantized_fp8_gemm(x, weight, scale, summed)

    def takes_gated(self, gate_up: torch.Tensor, out_features: int, facts: ScaleFacts | None,
                    quantize_x: bool) -> bool:
        """Whether matmul_gated runs for these [gate | up] rows: on the paths whose input quantization applies
        the activation as it reads them (fp8 and lookup tiles)."""
        lookup_scales = (facts or UNCHECKED).lookup_scales
        return gate_up.stride(-1) == 1 and gated_path(gate_up.shape[0], out_features, gate_up, quantize_x,
                                                      lookup_scales)

    def matmul_gated(self, gate_up: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     facts: ScaleFacts | None, summed: bool = True) -> torch.Tensor | PartialSums:
        facts = facts or UNCHECKED
        return mxfp4_gemm(gate_up, weight, scale, True, facts.wide_scales, lookup_scales=facts.lookup_scales,
                          gated=True, summed=summed)


class TritonMXFP4Experts:
    """The fused MoE kernels on packed FP4 weights: each expert's projection padded along K at load."""

    def prepare_weights(self, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                        down_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                           ScaleFacts]:
        gate_up, gate_up_scale = self._padded_per_expert(gate_up, gate_up_scale)
        down, down_scale = self._padded_per_expert(down, down_scale)
        wide = needs_wide_scales(gate_up_scale) or needs_wide_scales(down_scale)
        return gate_up, gate_up_scale, down, down_scale, ScaleFacts(wide_scales=wide)

    @staticmethod
    def _padded_per_expert(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        padded = [pad_to_k_align(weight[e], scale[e]) for e in range(weight.shape[0])]
        return torch.stack([w for w, _ in padded]), torch.stack([s for _, s in padded])

    def experts(self, x: torch.Tensor, gate_up: torch.Tensor, gate_up_scale: torch.Tensor, down: torch.Tensor,
                down_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                facts: ScaleFacts | None, quantize_x: bool, summed: bool = True) -> torch.Tensor | PartialSums:
        return mxfp4_moe_experts(x, gate_up, gate_up_scale, down, down_scale, topk_weights, topk_ids, quantize_x,
                                 (facts or UNCHECKED).wide_scales, summed=summed)


MXFP4_LINEAR = TritonMXFP4Linear()
MXFP4_EXPERTS = TritonMXFP4Experts()


# mxfp4_gemm with the weights padded at load
declare("mxfp4_linear", "triton", MXFP4_LINEAR, tuning=tuning,
        capabilities={"writes_partial_sums", "reads_quantized_rows", "reads_gated_input"})
# the moe_experts kernels on packed FP4 weights, which expand to bf16 (fp32 for fp32)
declare("mxfp4_moe_experts", "triton", MXFP4_EXPERTS, tuning=moe_tuning, capabilities={"writes_partial_sums"},
        refuses=refuses_experts("mxfp4_moe_experts", (torch.bfloat16, torch.float32)))
