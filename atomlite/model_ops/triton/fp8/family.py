"""The FP8 linear as layers call it (dispatch's fp8_linear) on the Triton GEMM: weights converted at load to the
platform's e4m3 (fnuz on gfx942, scales doubled), then one fused-quantization GEMM per call."""
import torch

from atomlite.model_ops.triton.common import platform_of
from atomlite.model_ops.triton.fp8.gemm import fp8_gemm
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec


class TritonFP8Linear:
    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec):
        if platform_of(weight.device).fp8_dtype == fp8.E4M3FNUZ_DTYPE:
            weight, scale = fp8.to_e4m3fnuz(weight, scale)
        return weight.contiguous(), scale.float().contiguous(), None

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
               prepared: None, spec: FP8Spec) -> torch.Tensor:
        return fp8_gemm(x, weight, scale, input_scale, spec.activation, spec.group_size, spec.block_k)


FP8_LINEAR = TritonFP8Linear()
