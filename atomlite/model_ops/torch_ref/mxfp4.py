import torch

from atomlite.quant import mxfp4


def mxfp4_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, quantize_x: bool) -> torch.Tensor:
    """x [M, K] @ dequantize(weight [N, K/2], weight_scale [N, K/32])^T, fp32 accumulation."""
    if quantize_x:
        x = mxfp4.quantize_dequantize(x)
    return (x.float() @ mxfp4.dequantize(weight, weight_scale).T).to(x.dtype)
