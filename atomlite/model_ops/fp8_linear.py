"""Linears whose weights are stored as FP8 e4m3 (compressed-tensors and Quark checkpoints): weight [N, K] with
per-tensor, per-channel or block scales, and the checkpoint's activation quantization (quant.fp8)."""
import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import GatedInput, PartialSums, TokenQuantization, TokenRows
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec

# Dummy weights (--load-format dummy): e4m3 values of about +-16 times these land near the float weights' 0.02.
DUMMY_WEIGHT_SCALE = 0.02 / 16
DUMMY_INPUT_SCALE = 8.0 / fp8.E4M3_MAX


def load_fp8_weight(param: torch.Tensor, loaded: torch.Tensor) -> None:
    if tuple(loaded.shape) != tuple(param.shape):
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
    if loaded.dtype != fp8.E4M3_DTYPE:
        raise ValueError(f"is {loaded.dtype}; an fp8 checkpoint stores float8_e4m3fn weights")
    param.data.copy_(loaded)


def scale_rows(loaded: torch.Tensor, spec: FP8Spec, rows: int, k: int) -> torch.Tensor:
    """A checkpoint's weight_scale for `rows` output rows -> atomlite's float32 [rows, scale columns]."""
    if spec.weight == "block":
        return fp8.expand_block_scales(loaded, rows, k, spec.block)
    expected = 1 if spec.weight == "tensor" else rows
    if loaded.numel() != expected:
        raise ValueError(f"weight_scale has shape {tuple(loaded.shape)}; a per-{spec.weight} scale has "
                         f"{expected} value(s)")
    return loaded.float().reshape(-1, 1).expand(rows, 1)


def load_input_scale(param: torch.Tensor, loaded: torch.Tensor, shard: int = 0) -> None:
    if loaded.numel() != 1:
        raise ValueError(f"input_scale has shape {tuple(loaded.shape)}; a static per-tensor scale is one value")
    param.data[shard] = loaded.float().reshape(())


class FP8Linear(nn.Module):
    """y = x W^T (no bias) with W in e4m3 and the spec's activation quantization. Shards (a fused projection made
    of several checkpoint Linears) keep their own weight scales; their static input scales, one per shard, must
    agree: the producing tools calibrate one for the shared input (the largest is used, as vLLM does)."""

    def __init__(self, in_features: int, out_features: int, spec: FP8Spec, shard_sizes: list[int] | None = None):
        super().__init__()
        self.in_features, self.out_features, self.spec = in_features, out_features, spec
        self.shard_sizes = list(shard_sizes or [out_features])
        self.shard_offsets = [sum(self.shard_sizes[:i]) for i in range(len(self.shard_sizes))]
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=fp8.E4M3_DTYPE), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, spec.scale_columns(in_features)),
                                         requires_grad=False)
        self.weight_scale.dummy_fill = DUMMY_WEIGHT_SCALE
        self.input_scale = None
        if spec.static_input:
            self.input_scale = nn.Parameter(torch.ones(len(self.shard_sizes)), requires_grad=False)
            self.input_scale.dummy_fill = DUMMY_INPUT_SCALE
        self._set_loaders()
        self.kernel = dispatch.choose("fp8_linear", n=out_features, k=in_features, weight=spec.weight,
                                      activation=spec.activation, block_n=spec.block_n, block_k=spec.block_k,
                                      group_size=spec.group_size, shard_sizes=tuple(self.shard_sizes),
                                      dtype=torch.get_default_dtype())
        self._family = self.kernel.fn
        self.prepared = None
        self.returns_partial_sums = False

    def _set_loaders(self) -> None:
        merged = len(self.shard_sizes) > 1
        for param in (self.weight, self.weight_scale, self.input_scale):
            if param is not None:
                param.weight_loader = self._load_shard if merged else self._load_whole
                if merged:
                    param.num_shards = len(self.shard_sizes)

    def _load_whole(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        self._load_shard(param, loaded, 0)

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: int) -> None:
        start, size = self.shard_offsets[shard], self.shard_sizes[shard]
        if param is self.input_scale:
            load_input_scale(param, loaded, shard)
        elif param is self.weight_scale:
            param.data[start:start + size] = scale_rows(loaded, self.spec, size, self.in_features)
        else:
            load_fp8_weight(param[start:start + size], loaded)

    @property
    def backend(self) -> str:
        return self.kernel.backend

    def process_after_loading(self) -> None:
        if self.input_scale is not None:
            self.input_scale.data = self.input_scale.data.amax().reshape(1)
        self.weight.data, self.weight_scale.data, self.prepared = self._family.prepare_weights(
            self.weight.data, self.weight_scale.data, self.spec)

    def forward(self, x: "torch.Tensor | TokenRows | GatedInput") -> torch.Tensor | PartialSums:
        """Linked to a consumer that reads them (model_ops.fusion), a split-K GEMM's output may be PartialSums; linked
        to a kernel before that writes them, x may come quantized per token (TokenRows), or as the MLP's
        [gate | up] whose gelu_tanh(gate) * up the quantization computes (GatedInput)."""
        if isinstance(x, TokenRows):
            return self._family.matmul_token_rows(x, self.weight, self.weight_scale, self.spec,
                                                  summed=not self.returns_partial_sums)
        gated = isinstance(x, GatedInput)
        x = x.gate_up if gated else x
        rows = x.reshape(-1, 2 * self.in_features if gated else self.in_features)
        summed = not self.returns_partial_sums or x.dim() != 2
        matmul = self._family.matmul_gated if gated else self._family.matmul
        y = matmul(rows, self.weight, self.weight_scale, self.input_scale, self.prepared, self.spec, summed)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def can(self, capability: str) -> bool:
        if capability == "reads_token_rows" and self.spec.activation != "token":
            return False
        if capability == "reads_gated_input" and self.spec.activation is None:
            return False  # weight-only: nothing quantizes x, so the activation kernel stays
        return self.kernel.can(capability)

    def takes_gated(self, gate_up: torch.Tensor) -> bool:
        """Whether this call computes gelu_tanh(gate) * up of gate_up itself, in its activation quantization
        (GeluTanhAndMul asks; linked only where the layer can): where that costs no more than the activation
        kernel would."""
        rows = gate_up.numel() // gate_up.shape[-1] if gate_up.shape[-1] else 0
        return self._family.takes_gated(rows, self.in_features, self.spec, gate_up.device)

    def input_quantization(self, x: torch.Tensor) -> TokenQuantization:
        """For the kernel that computes this layer's input x (linked where this layer reads TokenRows): per token, in
        the weight's e4m3."""
        return TokenQuantization(self.weight.dtype)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.spec.describe()}, "
                f"backend={self.backend}")



def fp8_note(model: nn.Module, platform) -> str | None:
    """The startup / plan line of a model with FP8 layers: their semantics and, on an e4m3fnuz GPU, the conversion;
    None without FP8 layers."""
    from atomlite.model_ops.fp8_moe import FP8Experts
    specs = {}
    for module in model.modules():
        if isinstance(module, (FP8Linear, FP8Experts)):
            specs[module.spec] = specs.get(module.spec, 0) + 1
    if not specs:
        return None
    kinds = "; ".join(f"{count} x {spec.describe()} ({spec.fmt})" for spec, count in specs.items())
    line = f"fp8 checkpoint: {kinds}"
    if platform.is_gpu and platform.fp8_dtype == fp8.E4M3FNUZ_DTYPE:
        line += (f"; {platform.arch} computes in e4m3fnuz: weights converted at load (same bits, scales x2, "
                 f"the factor-2 rule; -0 becomes +0), activations quantized on fnuz's grid to the same values")
    return line
