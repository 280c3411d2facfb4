"""FP8 linears on AITER's a8w8 GEMMs (gfx942, gfx950): the weights converted once at load, activations quantized by
atomlite's own kernel (quantize_rows, the checkpoint's semantics), the product by AITER.

What the GEMMs read (AITER ops/gemm_op_a8w8.py and op_tests/test_gemm_a8w8*.py, 0.1.7 and e4048607 alike):
  gemm_a8w8(XQ [M, K], WQ [N, K], x_scale [M, 1], w_scale [N, 1], dtype)
      Y = (XQ * x_scale) @ (WQ * w_scale)^T: x per token or one static scale, W per channel or per tensor.
  gemm_a8w8_blockscale(XQ [M, K], WQ [N, K], x_scale [M, K/128], w_scale [N/128, K/128], dtype)
      x per 128 columns of its row, W per 128 x 128 block, both scales row-major; K a multiple of 128 (its reference
      views x as [M, K/128, 128]), the last block of rows may be partial.
  Scales float32; fp8 is e4m3fnuz on gfx942 (weights and scales converted at load, the factor-2 rule) and e4m3fn
  on gfx950, as the Triton family does (triton.fp8.family.on_platform).
"""
import torch

from atomlite.model_ops.aiter import functions as F
from atomlite.model_ops.aiter.detect import call
from atomlite.model_ops.carriers import TokenRows
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.fp8.family import on_platform
from atomlite.model_ops.triton.fp8.quant import quantize_rows, quantizes_gated_cheaply
from atomlite.quant.fp8 import FP8Spec

BLOCK = 128  # gemm_a8w8_blockscale's block along N and K, and the activation group along K
OUT_DTYPES = (torch.bfloat16, torch.float16)


class AiterFP8Linear:
    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec):
        """-> (weight in the platform's e4m3, scales [N, 1], or [ceil(N / 128), K / 128] for blocks, None)."""
        weight, scale = on_platform(weight, scale)
        if spec.weight == "block":  # atomlite keeps one row per output row, each repeating its block's scales
            scale = scale[::spec.block_n].contiguous()
        return weight, scale, None

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
               prepared: None, spec: FP8Spec, summed: bool = True) -> torch.Tensor:
        xq, x_scale = quantize_rows(x, spec.activation, weight.dtype, spec.group_size, input_scale)
        return self._gemm(xq, x_scale, weight, scale, spec, x.dtype)

    def takes_gated(self, rows: int, k: int, spec: FP8Spec, device: torch.device) -> bool:
        return quantizes_gated_cheaply(rows, k, spec.activation, device)

    def matmul_gated(self, gate_up: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     input_scale: torch.Tensor | None, prepared: None, spec: FP8Spec,
                     summed: bool = True) -> torch.Tensor:
        """The GEMM on gelu_tanh(gate) * up of gate_up = [gate | up], computed as quantize_rows quantizes it."""
        xq, x_scale = quantize_rows(gate_up, spec.activation, weight.dtype, spec.group_size, input_scale, gated=True)
        return self._gemm(xq, x_scale, weight, scale, spec, gate_up.dtype)

    def matmul_token_rows(self, x: TokenRows, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec,
                          summed: bool = True) -> torch.Tensor:
        """x quantized per token by the kernel before (the residual update's TokenRows)."""
        return self._gemm(x.values, x.scales, weight, scale, spec, x.dtype)

    @staticmethod
    def _gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, spec: FP8Spec,
              out_dtype: torch.dtype) -> torch.Tensor:
        if xq.shape[0] == 0:  # no rows: nothing for AITER to launch
            return torch.empty(0, weight.shape[0], dtype=out_dtype, device=xq.device)
        if spec.weight == "block":
            return call(F.GEMM_A8W8_BLOCKSCALE, XQ=xq, WQ=weight, x_scale=x_scale, w_scale=scale, dtype=out_dtype)
        return call(F.GEMM_A8W8, XQ=xq, WQ=weight, x_scale=x_scale, w_scale=scale, dtype=out_dtype)


FP8_LINEAR = AiterFP8Linear()


def _refuses(platform, shape: dict) -> str | None:
    weight, activation = shape.get("weight"), shape.get("activation")
    if activation is None:
        return "AITER's a8w8 GEMMs multiply fp8 activations; weight-only FP8 (W8A16) is left to Triton"
    if shape.get("dtype", torch.bfloat16) not in OUT_DTYPES:
        return f"AITER's a8w8 GEMMs write bf16 or fp16, not {shape['dtype']}"
    if weight == "block":
        return _refuses_blocks(shape)
    if activation == "group":
        return "gemm_a8w8 takes one scale per token; activations in groups need block-scaled weights"
    return None


def _refuses_blocks(shape: dict) -> str | None:
    blocks = (shape.get("block_n"), shape.get("block_k"))
    if shape.get("activation") != "group" or shape.get("group_size") != BLOCK or blocks != (BLOCK, BLOCK):
        return (f"gemm_a8w8_blockscale takes {BLOCK}x{BLOCK} weight blocks with activations in groups of {BLOCK}, "
                f"not {shape.get('activation')} activations on {blocks[0]}x{blocks[1]} blocks")
    if shape.get("k", 0) % BLOCK:
        return f"gemm_a8w8_blockscale needs in_features divisible by {BLOCK} (got {shape['k']})"
    parts = shape.get("shard_sizes", ())
    if any(size % BLOCK for size in parts[:-1]):
        # each part keeps its own checkpoint's blocks; AITER reads one scale per 128 rows of the fused weight
        return (f"a fused projection of parts of {list(parts)} rows has scale blocks that straddle two parts; "
                f"gemm_a8w8_blockscale reads one scale per {BLOCK} rows")
    return None


# reads_token_rows: per-token layers take the residual update's quantized rows as they are; reads_gated_input: the
# down projection quantizes gelu_tanh(gate) * up as it computes it (quantize_rows)
declare("fp8_linear", "aiter", FP8_LINEAR, refuses=_refuses, requires=(F.GEMM_A8W8, F.GEMM_A8W8_BLOCKSCALE),
        capabilities={"reads_token_rows", "reads_gated_input"})
