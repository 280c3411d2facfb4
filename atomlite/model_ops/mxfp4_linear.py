"""A Linear whose weight is stored as MXFP4 (Quark checkpoints): uint8 weight [N, K/2] + e8m0 weight_scale [N, K/32]."""
import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import GatedInput, InputQuantization, PartialSums, QuantizedRows
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.sharding import ReducesOutput
from atomlite.quant.quark import LinearQuantSpec


def load_exact(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a checkpoint tensor that must already have the parameter's shape and dtype (packed bytes: no casts)."""
    if tuple(loaded.shape) != tuple(param.shape) or loaded.dtype != param.dtype:
        raise ValueError(f"expected {param.dtype} {tuple(param.shape)}, got {loaded.dtype} {tuple(loaded.shape)}")
    param.data.copy_(loaded)


class MXFP4Linear(nn.Module):
    """y = x W^T (no bias) with W in MXFP4; inputs are MXFP4 quantize-dequantized first when the spec says so.

    Load `weight` and `weight_scale` through their weight_loader, then call process_after_loading() once: the
    kernel family dispatch chose (mxfp4_linear) lays the weight out for its GEMMs there. Linked (model_ops.fusion),
    x may also come as the QuantizedRows that input_quantization asked the kernel before for, or as a GatedInput
    (takes_gated), and the output may go out as PartialSums, as far as the family can.
    """

    def __init__(self, in_features: int, out_features: int, spec: LinearQuantSpec):
        super().__init__()
        if in_features % spec.block_size:
            raise ValueError(f"MXFP4 Linear needs in_features divisible by {spec.block_size}, got {in_features}")
        self.in_features, self.out_features, self.spec = in_features, out_features, spec
        self.weight = nn.Parameter(torch.empty(out_features, in_features // 2, dtype=torch.uint8),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(
            torch.empty(out_features, in_features // spec.block_size, dtype=torch.uint8), requires_grad=False)
        self.weight.weight_loader = load_exact
        self.weight_scale.weight_loader = load_exact
        self.kernel = dispatch.choose("mxfp4_linear", n=out_features, k=in_features,
                                      dynamic_input=spec.dynamic_fp4_input)
        self._family = self.kernel.fn
        self.prepared = None  # what the family's prepare_weights made besides the tensors it keeps as parameters
        self.returns_partial_sums = False

    @property
    def backend(self) -> str:
        return self.kernel.backend

    def process_after_loading(self) -> None:
        self.weight.data, self.weight_scale.data, self.prepared = self._family.prepare_weights(
            self.weight.data, self.weight_scale.data)

    def copies_rows(self, platform: Platform | None = None) -> bool:
        """Whether the family would keep an e4m3 copy of this weight for GEMMs of many rows (make_row_copies), on
        platform (default the weight's)."""
        copies = getattr(self._family, "copies_rows", None)
        return copies is not None and copies(self.weight, self.spec.dynamic_fp4_input, platform)

    def row_copy_bytes(self) -> int:
        return self._family.row_copy_bytes(self.weight)

    def make_row_copy(self) -> bool:
        """Makes the copy (copies_rows first); False where the weight's scales do not allow an exact one."""
        self.prepared = self._family.with_row_copy(self.weight.data, self.weight_scale.data, self.prepared)
        return self.prepared.row_copy is not None

    def can(self, capability: str) -> bool:
        return self.kernel.can(capability)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms

    def input_quantization(self, x: torch.Tensor) -> InputQuantization | None:
        """For the kernel that computes this layer's input x (its rows, dtype and device as x's): the form in which
        to write x quantized (QuantizedRows) where this call's GEMM reads that; else None."""
        return self._family.input_quantization(x, self.weight, self.prepared, self.spec.dynamic_fp4_input)

    def takes_gated(self, gate_up: torch.Tensor) -> bool:
        """Whether this call would compute gelu_tanh(gate) * up of gate_up itself (forward of a GatedInput)."""
        rows = gate_up.reshape(-1, 2 * self.in_features)
        return self._family.takes_gated(rows, self.out_features, self.prepared, self.spec.dynamic_fp4_input)

    def forward(self, x: "torch.Tensor | QuantizedRows | GatedInput") -> torch.Tensor | PartialSums:
        if isinstance(x, QuantizedRows):
            return self._family.matmul_quantized(x, self.weight, self.weight_scale,
                                                 summed=not self.returns_partial_sums)
        if isinstance(x, GatedInput):
            return self._gated(x.gate_up)
        rows = x.reshape(-1, self.in_features)
        summed = not self.returns_partial_sums or x.dim() != 2
        y = self._family.matmul(rows, self.weight, self.weight_scale, self.prepared, self.spec.dynamic_fp4_input,
                                summed)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def _gated(self, gate_up: torch.Tensor) -> torch.Tensor | PartialSums:
        rows = gate_up.reshape(-1, 2 * self.in_features)
        summed = not self.returns_partial_sums or gate_up.dim() != 2
        y = self._family.matmul_gated(rows, self.weight, self.weight_scale, self.prepared, summed)
        return y if gate_up.dim() == 2 else y.reshape(*gate_up.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dynamic_fp4_input={self.spec.dynamic_fp4_input}, backend={self.backend}")


class MXFP4MergedLinear(MXFP4Linear):
    """Several MXFP4 projections of one input stored as one (e.g. gate and up); the checkpoint keeps them apart
    and weight_loader(param, tensor, shard) copies shard i's rows of the packed weight and of its scales."""

    def __init__(self, in_features: int, out_features: list[int], spec: LinearQuantSpec):
        super().__init__(in_features, sum(out_features), spec)
        self.shard_offsets = [sum(out_features[:i]) for i in range(len(out_features))]
        self.shard_sizes = list(out_features)
        for param in (self.weight, self.weight_scale):
            param.weight_loader = self._load_shard
            param.num_shards = len(out_features)

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: int) -> None:
        start, size = self.shard_offsets[shard], self.shard_sizes[shard]
        load_exact(param[start:start + size], loaded)


class RowParallelMXFP4Linear(ReducesOutput, MXFP4Linear):
    """An MXFP4Linear holding a slice of the input dim, on 32-element block boundaries: its output is all-reduced."""


def _copied_layers(model: nn.Module, platform: Platform | None = None) -> tuple[list[MXFP4Linear], int]:
    """The MXFP4 layers whose family keeps a row copy on platform (default their weights'), and its bytes."""
    layers = [m for m in model.modules() if isinstance(m, MXFP4Linear) and m.copies_rows(platform)]
    return layers, sum(layer.row_copy_bytes() for layer in layers)


def make_row_copies(model: nn.Module, budget: int | None) -> str | None:
    """e4m3 copies of the MXFP4 weights whose family keeps them (copies_rows), all of them if together they take at
    most budget bytes (None: no limit), else none; the startup line that says so, or None without such weights."""
    layers, need = _copied_layers(model)
    if not layers:
        return None
    if budget is not None and need > budget:
        return (f"mxfp4: no e4m3 weight copies for GEMMs of many rows: {need / 2**30:.2f} GiB, more than half the "
                f"{2 * budget / 2**30:.2f} GiB left beside the weights; those GEMMs expand the packed weights")
    made = [layer for layer in layers if layer.make_row_copy()]
    held = sum(layer.row_copy_bytes() for layer in made)
    line = (f"mxfp4: e4m3 copies of {len(made)} of {len(layers)} weights ({held / 2**30:.2f} GiB beside the packed "
            f"ones) for GEMMs of {layers[0]._family.ROW_COPY_MIN_ROWS}+ rows")
    if len(made) < len(layers):
        line += ("; the others' scales allow no exact copy (a nonzero block over 14 binades under its row's largest, "
                 "a NaN scale, or a row's largest under 2^-120)")
    return line


def row_copy_plan_line(model: nn.Module, platform: Platform) -> str | None:
    """`atomlite plan`'s line for the copies make_row_copies would make on platform; None where it makes none."""
    layers, need = _copied_layers(model, platform)
    if not layers:
        return None
    return (f"mxfp4: e4m3 copies of {len(layers)} weights for GEMMs of {layers[0]._family.ROW_COPY_MIN_ROWS}+ rows, "
            f"{need / 2**30:.2f} GiB beside the weights above, made at load where they fit in half the memory left "
            f"beside the weights")
