"""A Linear whose weight is stored as MXFP4 (Quark checkpoints): uint8 weight [N, K/2] + e8m0 weight_scale [N, K/32]."""
import torch
from torch import nn

from atomlite.model_ops.partial_sums import PartialSums
from atomlite.model_ops.triton.mxfp4.gemm import (gated_path, input_quantization, mxfp4_gemm, needs_wide_scales,
                                                  pad_to_k_align)
from atomlite.model_ops.triton.mxfp4.fp8_tiles import InputQuantization, QuantizedRows, quantized_fp8_gemm
from atomlite.model_ops.triton.mxfp4.lookup import scale_bytes_fit
from atomlite.quant import mxfp4
from atomlite.quant.quark import LinearQuantSpec

BACKENDS = ("torch", "triton", "aiter")


def load_exact(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a checkpoint tensor that must already have the parameter's shape and dtype (packed bytes: no casts)."""
    if tuple(loaded.shape) != tuple(param.shape) or loaded.dtype != param.dtype:
        raise ValueError(f"expected {param.dtype} {tuple(param.shape)}, got {loaded.dtype} {tuple(loaded.shape)}")
    param.data.copy_(loaded)


class MXFP4Linear(nn.Module):
    """y = x W^T (no bias) with W in MXFP4; inputs are MXFP4 quantize-dequantized first when the spec says so.

    Load `weight` and `weight_scale` through their weight_loader, then call process_after_loading() once.
    backend "torch" dequantizes W on every call (the reference); "triton" reads the packed bytes in the GEMM;
    "aiter" (gfx950) re-lays W out once at load for gemm_a4w4.
    """

    def __init__(self, in_features: int, out_features: int, spec: LinearQuantSpec, backend: str = "torch"):
        super().__init__()
        if in_features % spec.block_size:
            raise ValueError(f"MXFP4 Linear needs in_features divisible by {spec.block_size}, got {in_features}")
        if backend not in BACKENDS:
            raise ValueError(f"MXFP4 backend {backend!r} is not one of {', '.join(BACKENDS)}")
        self.in_features, self.out_features, self.spec, self.backend = in_features, out_features, spec, backend
        self.weight = nn.Parameter(torch.empty(out_features, in_features // 2, dtype=torch.uint8),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(
            torch.empty(out_features, in_features // spec.block_size, dtype=torch.uint8), requires_grad=False)
        self.weight.weight_loader = load_exact
        self.weight_scale.weight_loader = load_exact
        self._matmul = {"triton": self._triton, "aiter": self._aiter, "torch": self._torch}[backend]
        self.wide_scales, self.lookup_scales = True, False  # always right; process_after_loading checks
        self._prepared = None

    def process_after_loading(self) -> None:
        if self.backend == "aiter":
            from atomlite.model_ops import aiter
            self._prepared = aiter.prepare_weight(self.weight.data, self.weight_scale.data)
            self.weight.data = self.weight_scale.data = torch.empty(0, dtype=torch.uint8, device=self.weight.device)
        if self.backend == "triton":
            weight, scale = pad_to_k_align(self.weight.data, self.weight_scale.data)
            self.weight.data, self.weight_scale.data = weight, scale
            self.wide_scales = needs_wide_scales(scale)
            self.lookup_scales = scale_bytes_fit(weight, scale)

    def input_quantization(self, x: torch.Tensor) -> InputQuantization | None:
        """For the kernel that computes this layer's input x (its rows, dtype and device as x's): the form in which
        to write x quantized (QuantizedRows) where this call's GEMM runs the fp8 tiles; else None."""
        if self.backend != "triton" or not self.spec.dynamic_fp4_input or x.dim() != 2:
            return None
        return input_quantization(x.shape[0], self.weight, x, True, self.lookup_scales)

    def forward(self, x: torch.Tensor | QuantizedRows, summed: bool = True) -> torch.Tensor | PartialSums:
        """summed=False (2-D x): the output may come back as PartialSums, as Linear.forward's. x may be the
        QuantizedRows that input_quantization asked for."""
        if isinstance(x, QuantizedRows):
            return quantized_fp8_gemm(x, self.weight, self.weight_scale, summed)
        if x.dim() == 2 and not summed and self.backend == "triton":
            return self._triton(x, summed=False)
        rows = x.reshape(-1, self.in_features)
        y = self._matmul(rows)
        return y.reshape(*x.shape[:-1], self.out_features)

    def forward_gated(self, gate_up: torch.Tensor, act: nn.Module, summed: bool = True) -> torch.Tensor | PartialSums:
        """self(act(gate_up)) for act = gelu_tanh(gate) * up: on the fp8 and lookup paths the activation is computed
        by this layer's input quantization (one launch fewer)."""
        rows = gate_up.reshape(-1, 2 * self.in_features)
        if not (self.backend == "triton" and rows.stride(-1) == 1
                and gated_path(rows.shape[0], self.out_features, rows, self.spec.dynamic_fp4_input,
                               self.lookup_scales)):
            return self(act(gate_up), summed=summed)
        y = mxfp4_gemm(rows, self.weight, self.weight_scale, True, self.wide_scales, lookup_scales=self.lookup_scales,
                       gated=True, summed=summed or gate_up.dim() != 2)
        return y if isinstance(y, PartialSums) else y.reshape(*gate_up.shape[:-1], self.out_features)

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.dynamic_fp4_input:
            x = mxfp4.quantize_dequantize(x)
        w = mxfp4.dequantize(self.weight, self.weight_scale)
        return (x.to(torch.float32) @ w.T).to(x.dtype)

    def _triton(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor | PartialSums:
        if x.stride(-1) != 1:
            x = x.contiguous()
        return mxfp4_gemm(x, self.weight, self.weight_scale, self.spec.dynamic_fp4_input, self.wide_scales,
                          lookup_scales=self.lookup_scales, summed=summed)

    def _aiter(self, x: torch.Tensor) -> torch.Tensor:
        from atomlite.model_ops import aiter
        return aiter.mxfp4_linear(x, self._prepared)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dynamic_fp4_input={self.spec.dynamic_fp4_input}, backend={self.backend}")


class MXFP4MergedLinear(MXFP4Linear):
    """Several MXFP4 projections of one input stored as one (e.g. gate and up); the checkpoint keeps them apart
    and weight_loader(param, tensor, shard) copies shard i's rows of the packed weight and of its scales."""

    def __init__(self, in_features: int, out_features: list[int], spec: LinearQuantSpec, backend: str = "torch"):
        super().__init__(in_features, sum(out_features), spec, backend)
        self.shard_offsets = [sum(out_features[:i]) for i in range(len(out_features))]
        self.shard_sizes = list(out_features)
        for param in (self.weight, self.weight_scale):
            param.weight_loader = self._load_shard
            param.num_shards = len(out_features)

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: int) -> None:
        start, size = self.shard_offsets[shard], self.shard_sizes[shard]
        load_exact(param[start:start + size], loaded)
