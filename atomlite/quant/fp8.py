"""FP8 (e4m3) checkpoints: what a layer's weights and activations mean, and the reference math in plain torch.

compressed-tensors (llm-compressor) and Quark both store `weight` as float8_e4m3fn [N, K] with a float
`weight_scale` (W = weight * scale) and, for static activations, an `input_scale`. A dynamic activation is
quantized per call: scale = amax / 448 over its token (or its group of K), x / scale rounded to e4m3 (saturating),
times scale again. atomlite keeps every weight scale as float32 [N, ceil(K / block_k)] (one column for per-tensor
and per-channel scales, one per 128-K block for block scales, each row repeating its block's scale), so shards of a
fused projection with different scales, and blocks that straddle two shards, stay exact.
"""
from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
E4M3_DTYPE = torch.float8_e4m3fn
E4M3FNUZ_DTYPE = torch.float8_e4m3fnuz

WEIGHT_STRATEGIES = ("tensor", "channel", "block")
# None: weight-only (W8A16); "static": one calibrated input_scale per tensor; "token" / "group": dynamic.
ACTIVATIONS = (None, "static", "token", "group")


@dataclass(frozen=True, slots=True)
class FP8Spec:
    """How one FP8 Linear (or a model's experts) is stored and run."""
    weight: str  # one of WEIGHT_STRATEGIES
    activation: str | None  # one of ACTIVATIONS
    block: tuple[int, int] = (128, 128)  # weight block [rows, K] when weight == "block"
    group_size: int = 128  # K per activation scale when activation == "group"
    fmt: str = ""  # the producing format, for messages ("compressed-tensors", "quark")

    @property
    def block_k(self) -> int:
        """K per stored weight-scale column: the block's K, or the whole K."""
        return self.block[1] if self.weight == "block" else 0

    @property
    def block_n(self) -> int:
        """Output rows per weight block, 0 unless block-scaled."""
        return self.block[0] if self.weight == "block" else 0

    @property
    def static_input(self) -> bool:
        return self.activation == "static"

    def scale_columns(self, k: int) -> int:
        return -(-k // self.block_k) if self.block_k else 1

    def describe(self) -> str:
        weight = f"block {self.block[0]}x{self.block[1]}" if self.weight == "block" else f"per-{self.weight}"
        act = {None: "weight-only (W8A16)", "static": "static per-tensor activations",
               "token": "dynamic per-token activations",
               "group": f"dynamic per-group-{self.group_size} activations"}[self.activation]
        return f"fp8 e4m3 {weight} weights, {act}"


def nonzero(scale: torch.Tensor) -> torch.Tensor:
    """A zero scale (an all-zero token or group) replaced by the dtype's eps, as compressed-tensors does: the
    quantized values are zeros either way, without 0 / 0."""
    return torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (half to even), saturating at +-448; float32 out."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(E4M3_DTYPE).float()


def dynamic_scales(x: torch.Tensor, activation: str, group_size: int = 128) -> torch.Tensor:
    """Per-token [..., 1] or per-group [..., ceil(K / group)] scales amax / 448 of x, in x's dtype."""
    if activation == "token":
        return nonzero(x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX)
    if activation == "group":
        groups = torch.nn.functional.pad(x, (0, -x.shape[-1] % group_size))
        groups = groups.reshape(*x.shape[:-1], -1, group_size)
        return nonzero(groups.abs().amax(dim=-1) / E4M3_MAX)
    raise ValueError(f"no dynamic scales for activation {activation!r}")


def _per_element(scale: torch.Tensor, k: int, group: int) -> torch.Tensor:
    """[..., G] scales of `group`-wide groups along K (the last one may be partial) -> [..., k]."""
    if scale.shape[-1] == 1:
        return scale
    return scale.repeat_interleave(group, dim=-1)[..., :k]


def quantize_dequantize_input(x: torch.Tensor, spec: FP8Spec, input_scale: torch.Tensor | None = None
                              ) -> torch.Tensor:
    """What the checkpoint's activation quantization makes of x (float32 out); x unchanged for W8A16."""
    if spec.activation is None:
        return x.float()
    if spec.activation == "static":
        scale = input_scale.float().reshape(())
    else:
        scale = _per_element(dynamic_scales(x.float(), spec.activation, spec.group_size), x.shape[-1],
                             spec.group_size)
    return round_e4m3(x.float() / scale) * scale


def expand_block_scales(scale: torch.Tensor, rows: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    """Block scales [ceil(rows / bn), ceil(k / bk)] -> atomlite's [rows, ceil(k / bk)] (each row its block's)."""
    expected = (-(-rows // block[0]), -(-k // block[1]))
    if tuple(scale.shape) != expected:
        raise ValueError(f"block weight_scale has shape {tuple(scale.shape)}, expected {expected}")
    return scale.float().repeat_interleave(block[0], dim=0)[:rows]


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, block_k: int = 128) -> torch.Tensor:
    """weight [..., N, K] (any fp8 dtype) with atomlite's scales [..., N, G] (G > 1: one per block_k of K) ->
    float32 [..., N, K]."""
    return weight.float() * _per_element(scale.float(), weight.shape[-1], block_k)


def quantize_weight(w: torch.Tensor, spec: FP8Spec) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], scales as the checkpoint stores them: [] tensor, [N, 1] channel, blocks),
    with the amax / 448 scales both tools compute. For tests and dummy weights."""
    w = w.float()
    if spec.weight == "tensor":
        scale = nonzero(w.abs().amax() / E4M3_MAX)
        return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3_DTYPE), scale
    if spec.weight == "channel":
        scale = nonzero(w.abs().amax(dim=1, keepdim=True) / E4M3_MAX)
        return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3_DTYPE), scale
    bn, bk = spec.block
    n, k = w.shape
    padded = torch.nn.functional.pad(w, (0, -k % bk, 0, -n % bn))
    blocks = padded.reshape(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    scale = nonzero(blocks.abs().amax(dim=(1, 3)) / E4M3_MAX)
    full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    return (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3_DTYPE), scale


def gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, spec: FP8Spec,
         input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T with the checkpoint's activation semantics, float32 accumulation, x's dtype out."""
    xq = quantize_dequantize_input(x, spec, input_scale)
    return (xq @ dequantize_weight(weight, weight_scale, spec.block[1]).T).to(x.dtype)


def to_e4m3fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fn weights for a GPU whose fp8 is e4m3fnuz (MI300X, gfx942): the same bits mean half the value there, so
    the scales double (the factor-2 rule); fn's -0 (0x80) is fnuz's NaN and becomes +0."""
    bits = weight.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(E4M3FNUZ_DTYPE), scale * 2
