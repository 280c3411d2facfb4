"""The layers of Gemma 4's vision encoder: the patch embedder with its learned 2-D position table, attention with 2-D
RoPE over an image's patches, the gated MLP, and the linears that clip what they read and write (E2B/E4B towers).

They work on the real patches of one or more images packed along the token dim (model_ops.packed); padding rows
never reach them. Every linear is whole on every tensor-parallel rank: the tower is replicated.
"""
import torch
from torch import nn

from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.activation import GeluTanhAndMul
from atomlite.model_ops.encoder_attention import EncoderAttention
from atomlite.model_ops.linear import copy_weight
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.norm import RMSNorm
from atomlite.model_ops.packed import PackedSequences

CLIP_BOUNDS = {"input_min": -float("inf"), "input_max": float("inf"),
               "output_min": -float("inf"), "output_max": float("inf")}


def loaded_parameter(*shape: int) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape), requires_grad=False)
    param.weight_loader = copy_weight
    return param


class VisionLinear(nn.Module):
    """The Linear at `{prefix}.linear`; clipped (use_clipped_linears), its input and output are clamped to ranges the
    checkpoint stores with it. Several out_features: one GEMM for projections of the same input (unclipped only),
    loaded from the checkpoint's separate tensors (the model's packed_weights)."""

    def __init__(self, lin: LinearBuilder, prefix: str, in_features: int, out_features: int | list[int],
                 clipped: bool):
        super().__init__()
        if isinstance(out_features, list):
            assert not clipped, "a clipped linear clamps its own output: it fuses with none"
            self.linear = lin.merged(f"{prefix}.linear", in_features, out_features)
        else:
            self.linear = lin.linear(f"{prefix}.linear", in_features, out_features)
        self.clipped = clipped
        if clipped:
            for name, unbounded in CLIP_BOUNDS.items():
                bound = loaded_parameter()
                bound.dummy_fill = unbounded  # dummy weights clip nothing
                setattr(self, name, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        x = torch.clamp(x, self.input_min, self.input_max)
        return torch.clamp(self.linear(x), self.output_min, self.output_max)


class VisionPatchEmbedder(nn.Module):
    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden = cfg["hidden_size"]
        self.input_proj = lin.linear(f"{prefix}.input_proj", 3 * cfg.get("patch_size", 16) ** 2, hidden)
        # one table per axis: row x of the first plus row y of the second place a patch
        self.position_embedding_table = loaded_parameter(2, cfg.get("position_embedding_size", 10 * 1024), hidden)

    def forward(self, pixels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """pixels: [T, 3 * patch^2] in [0, 1], as the processor rescales them; positions: [T, 2] (x, y)."""
        table = self.position_embedding_table
        # trained on pixels in [-1, 1]: the processor leaves this mapping to the model
        x = self.input_proj((2 * (pixels.float() - 0.5)).to(table.dtype))
        return x + (table[0][positions[:, 0]] + table[1][positions[:, 1]])


class VisionRotaryEmbedding(nn.Module):
    """2-D RoPE: the first half of each head turns with the patch's x, the second half with its y, each half as
    rotate-half RoPE over head_dim / 4 frequencies."""

    def __init__(self, head_dim: int, params: dict):
        super().__init__()
        if head_dim % 4:
            raise ConfigError(f"vision_config head_dim {head_dim} must be a multiple of 4 (2-D RoPE turns each half of "
                              f"a head as pairs)")
        if params.get("rope_type", "axial") != "axial":
            raise ConfigError(f"vision_config rope_type {params['rope_type']!r} is not supported (supported: axial)")
        half = head_dim // 2
        exponents = torch.arange(0, half, 2, dtype=torch.float32) / half
        self.register_buffer("inv_freq", 1.0 / params.get("rope_theta", 100.0) ** exponents, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 2, head_dim / 2] each: per axis, the angles of both halves of its rotate-half pairs."""
        freqs = positions[..., None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


class VisionAttention(nn.Module):
    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, eps, clipped = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6), bool(cfg.get("use_clipped_linears"))
        heads, self.head_dim = cfg["num_attention_heads"], cfg["head_dim"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        self.qkv_sizes = [heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.head_dim]
        # one GEMM for q, k and v unless each clamps its own output
        self.fused = not clipped
        if self.fused:
            self.qkv_proj = VisionLinear(lin, f"{prefix}.qkv_proj", hidden, self.qkv_sizes, False)
        else:
            for name, size in zip(("q_proj", "k_proj", "v_proj"), self.qkv_sizes):
                setattr(self, name, VisionLinear(lin, f"{prefix}.{name}", hidden, size, clipped))
        self.o_proj = VisionLinear(lin, f"{prefix}.o_proj", heads * self.head_dim, hidden, clipped)
        self.heads, self.kv_heads = heads, kv_heads
        # the norms' weights (checkpoint tensors); one kernel applies them, v's unlearned norm and the 2-D RoPE
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        self.prepare = dispatch.choose("axial_qkv_norm_rope", head_dim=self.head_dim).fn
        self.attn = EncoderAttention(heads, kv_heads, self.head_dim, scale=1.0)  # the q/k norms set the scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, packed: PackedSequences):
        qkv = self.qkv_proj(x) if self.fused else torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)
        heads = self.prepare(qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin, self.heads,
                             self.kv_heads)
        q, k, v = heads.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        return self.o_proj(self.attn(q, k, v, packed).flatten(1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, intermediate = cfg["hidden_size"], cfg["intermediate_size"]
        clipped = bool(cfg.get("use_clipped_linears"))
        if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ConfigError(f"vision_config hidden_activation {cfg['hidden_activation']!r} is not supported "
                              f"(supported: gelu_pytorch_tanh)")
        # one GEMM for gate and up, and one kernel for gelu(gate) * up, unless each clamps its own output
        self.fused = not clipped
        if self.fused:
            self.gate_up_proj = VisionLinear(lin, f"{prefix}.gate_up_proj", hidden, [intermediate, intermediate], False)
            self.act_and_mul = GeluTanhAndMul(intermediate)
        else:
            self.gate_proj = VisionLinear(lin, f"{prefix}.gate_proj", hidden, intermediate, clipped)
            self.up_proj = VisionLinear(lin, f"{prefix}.up_proj", hidden, intermediate, clipped)
            self.act = nn.GELU(approximate="tanh")
        self.down_proj = VisionLinear(lin, f"{prefix}.down_proj", intermediate, hidden, clipped)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionEncoderLayer(nn.Module):
    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = VisionAttention(cfg, lin, f"{prefix}.self_attn")
        self.mlp = VisionMLP(cfg, lin, f"{prefix}.mlp")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(hidden, eps))

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, packed: PackedSequences):
        """h: the residual stream, in and out."""
        attn = self.self_attn(self.input_layernorm(h), cos, sin, packed)
        h = self.post_attention_layernorm.add_to_residual(attn, h)
        m = self.mlp(h.normed(self.pre_feedforward_layernorm))
        return self.post_feedforward_layernorm.add_to_residual(m, h.stream).stream


class VisionEncoder(nn.Module):
    """Bidirectional within each image: the packed images never see each other."""

    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        self.rope = VisionRotaryEmbedding(cfg["head_dim"], cfg.get("rope_parameters") or {})
        self.layers = nn.ModuleList(VisionEncoderLayer(cfg, lin, f"{prefix}.layers.{i}")
                                    for i in range(cfg["num_hidden_layers"]))

    def forward(self, h: torch.Tensor, positions: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
        cos, sin = self.rope.cos_sin(positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, packed)
        return h
