"""What one kernel hands the next in place of a plain tensor, where the two are linked (model_ops.fusion): a split-K
GEMM's slices not yet added, two branches' output norms not yet joined, rows already quantized for the GEMM that
reads them (in blocks for MXFP4, per token for FP8), an MLP's [gate | up] whose activation the reading GEMM
computes, and a row-parallel product's share not yet summed over the tensor-parallel ranks. Kernels and layers both
import them from here; which kernel reads or writes which is a capability of the kernel (dispatch.CAPABILITIES)."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PartialSums:
    """y [M, N] as partial sums parts [S, M, N] (fp32, or rounded to dtype), one per K slice or routed expert: y
    is their sum, added in fp32 in slice order and rounded to dtype (as the GEMM's own summing kernel writes it).
    The norm kernels take it in place of y and add the slices themselves, which saves the summing launch."""
    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]


@dataclass(frozen=True)
class NormedPair:
    """rms_norm(a, weight_a) + rms_norm(b, weight_b), each norm and the sum rounded to the activation dtype: two
    branches of a layer joined, each through its own output norm (a and b may be PartialSums). The residual update
    that reads it computes it as it reads the row, which saves a launch."""
    a: "torch.Tensor | PartialSums"
    b: "torch.Tensor | PartialSums"
    weight_a: torch.Tensor
    weight_b: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.b.shape


@dataclass(frozen=True)
class RankPartials:
    """y: the sum over the tensor-parallel ranks of part, this rank's share of a row-parallel product, left for the
    kernel that reads y to exchange through channel (a model_ops.peer_memory.PeerChannel) and add: the all-reduce's
    launch is saved. part may be PartialSums (its split-K slices, for a kernel that also reads those: added, rounded,
    then exchanged). A NormedPair's two sides are RankPartials together or not at all."""
    part: "torch.Tensor | PartialSums"
    channel: object

    @property
    def shape(self) -> torch.Size:
        return self.part.shape


@dataclass(frozen=True, slots=True)
class InputQuantization:
    """How a GEMM wants its x quantized, for a kernel before it that writes x in that form (a norm, the attention's
    split-KV merge): the block-diagonal period and the weight's padded K."""
    period: int
    k_padded: int


@dataclass(frozen=True, slots=True)
class QuantizedRows:
    """x [rows, K] quantized as the fp8 MXFP4 GEMM's own activation quantization writes it (values [period * rows,
    K'] e4m3, block scales fp32 [rows, K'/32]), by the kernel that computed x; dtype is x's (the GEMM's output
    dtype)."""
    values: torch.Tensor
    scales: torch.Tensor
    rows: int
    period: int
    dtype: torch.dtype

    @staticmethod
    def empty(rows: int, form: InputQuantization, dtype: torch.dtype, device: torch.device) -> "QuantizedRows":
        values = torch.empty((form.period * rows, form.k_padded), dtype=torch.float8_e4m3fn, device=device)
        scales = torch.empty((rows, form.k_padded // 32), dtype=torch.float32, device=device)
        return QuantizedRows(values, scales, rows, form.period, dtype)


@dataclass(frozen=True, slots=True)
class TokenQuantization:
    """How an FP8 GEMM with dynamic per-token activations wants its x, for a kernel before it that writes x so: each
    row in fp8_dtype, scaled by its amax / 448 (e4m3fnuz: the value halved, the scale doubled)."""
    fp8_dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class TokenRows:
    """x [rows, K] quantized per token as TokenQuantization says, by the kernel that computed x: values [rows, K],
    scales fp32 [rows, 1] (as fp8.quant.quantize_rows writes them); dtype is x's (the GEMM's output dtype)."""
    values: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype

    @staticmethod
    def empty(rows: int, k: int, form: TokenQuantization, dtype: torch.dtype, device: torch.device) -> "TokenRows":
        return TokenRows(torch.empty((rows, k), dtype=form.fp8_dtype, device=device),
                         torch.empty((rows, 1), dtype=torch.float32, device=device), dtype)


@dataclass(frozen=True)
class GatedInput:
    """gelu_tanh(gate) * up of gate_up = [gate | up] [..., 2I], left for the GEMM that reads it to compute as it
    quantizes its input (one launch fewer)."""
    gate_up: torch.Tensor


def split_columns(y: "torch.Tensor | PartialSums", sizes: list[int]) -> list:
    """y's last dimension in pieces of sizes (views; a PartialSums gives PartialSums of its slices' columns)."""
    if not isinstance(y, PartialSums):
        return list(y.split(sizes, dim=-1))
    return [PartialSums(part, y.dtype) for part in y.parts.split(sizes, dim=-1)]


def as_heads(y: "torch.Tensor | PartialSums", head_dim: int) -> "torch.Tensor | PartialSums":
    """[T, H * head_dim] -> [T, H, head_dim] (a view)."""
    if not isinstance(y, PartialSums):
        return y.view(y.shape[0], -1, head_dim)
    return PartialSums(y.parts.view(*y.parts.shape[:2], -1, head_dim), y.dtype)


def merged_heads(y: "torch.Tensor | QuantizedRows") -> "torch.Tensor | QuantizedRows":
    """[T, H, head_dim] -> [T, H * head_dim] (a view); QuantizedRows are written as rows already."""
    return y if isinstance(y, QuantizedRows) else y.flatten(1)


def summed(y: "torch.Tensor | PartialSums") -> torch.Tensor:
    """y as a tensor: a PartialSums added up in slice order, anything else as it is."""
    if isinstance(y, RankPartials):
        raise TypeError("RankPartials are summed over the ranks by the kernel that reads them, not here")
    if not isinstance(y, PartialSums):
        return y
    total = y.parts[0].to(torch.float32, copy=True)
    for part in y.parts[1:]:
        total += part
    return total.to(y.dtype)
