"""Gemma 4 text decoder: dense (31B), MoE (26B-A4B) and per-layer-embedding + KV-sharing (E2B/E4B) variants.

Math per shared/docs/GEMMA4.md, checked against transformers' modeling_gemma4.py. The model declares its KV
specs and weight names; batching details reach it only through the ForwardContext.
"""
import math
import re

import torch
from torch import nn

from atomlite.config import ModelSpec
from atomlite.errors import ConfigError
from atomlite.engine.kv_spec import KVSpec
from atomlite.model_ops import dispatch
from atomlite.model_ops.activation import GeluTanhAndMul
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.branches import side_by_side
from atomlite.model_ops.context import ForwardContext
from atomlite.model_ops.embedding import ScaledEmbedding
from atomlite.model_ops.linear import Linear, copy_weight
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.norm import RMSNorm
from atomlite.model_ops.partial_sums import as_heads, split_columns
from atomlite.model_ops.rope import RotaryEmbedding, inv_freq_from_params


OVERLAP_MAX_TOKENS = 16  # beyond decode-sized batches both feed-forward branches fill the GPU by themselves


def kv_share_targets(layer_kinds: list[str], num_shared: int) -> dict[int, int]:
    """Shared layer -> the last earlier non-shared layer of its kind, whose K/V it reuses."""
    first_shared = len(layer_kinds) - num_shared
    targets = {}
    for i in range(first_shared, len(layer_kinds)):
        owners = [j for j in range(first_shared) if layer_kinds[j] == layer_kinds[i]]
        if not owners:
            raise ConfigError(f"layer {i} ({layer_kinds[i]}) shares KV but no earlier layer of its kind owns any")
        targets[i] = owners[-1]
    return targets


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: dict, layer, window: int | None, shares_kv: bool, lin: LinearBuilder, prefix: str,
                 key_rope: RotaryEmbedding | None = None):
        super().__init__()
        hidden, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("rms_norm_eps", 1e-6)
        self.head_dim = layer.head_dim
        kv_dim = layer.num_kv_heads * self.head_dim
        # One GEMM for q, k and v (no v on k_eq_v layers: V comes from raw k; q alone on KV-sharing layers), unless
        # the checkpoint quantizes them differently: then one projection each.
        kv_parts = [] if shares_kv else [kv_dim] if layer.k_eq_v else [kv_dim, kv_dim]
        self.qkv_sizes = [heads * self.head_dim] + kv_parts
        self.qkv_names = ["q_proj", "k_proj", "v_proj"][:len(self.qkv_sizes)]
        parts = [f"{prefix}.{name}" for name in self.qkv_names]
        self.fused_qkv = lin.can_fuse(parts)
        if self.fused_qkv:
            self.qkv_proj = lin.merged(f"{prefix}.qkv_proj", hidden, self.qkv_sizes, parts)
        else:
            for name, size in zip(self.qkv_names, self.qkv_sizes):
                setattr(self, name, lin.linear(f"{prefix}.{name}", hidden, size))
        self.q_norm = RMSNorm(self.head_dim, eps)
        if not shares_kv:
            self.k_norm = RMSNorm(self.head_dim, eps)
        self.shares_kv = shares_kv
        self.o_proj = lin.linear(f"{prefix}.o_proj", heads * self.head_dim, hidden)
        self.attn = Attention(heads, layer.num_kv_heads, self.head_dim, scale=1.0, window=window, key_rope=key_rope)

    @property
    def input_linear(self) -> nn.Module | None:
        """The one linear that reads this sublayer's input (None with separate q/k/v projections)."""
        return self.qkv_proj if self.fused_qkv else None

    def forward(self, x, cos, sin, ctx: ForwardContext):
        """x: the normed input, or the QuantizedRows that input_linear asked for."""
        if self.fused_qkv:  # the q/k/v prepare adds split-K slices as it reads them
            parts = split_columns(self.qkv_proj(x, summed=False), self.qkv_sizes)
        else:
            parts = [getattr(self, name)(x) for name in self.qkv_names]
        q, k, v, k_weight = as_heads(parts[0], self.head_dim), None, None, None
        if not self.shares_kv:  # V is v_norm of the raw k projection on k_eq_v layers (parts[-1] is k then)
            k, v, k_weight = (as_heads(parts[1], self.head_dim), as_heads(parts[-1], self.head_dim),
                              self.k_norm.weight)
        out = self.attn.forward_raw(q, k, v, self.q_norm.weight, k_weight, self.q_norm.eps, cos, sin, ctx,
                                    feeding=self.o_proj)
        return self.o_proj(out, summed=False)  # the layer's norm kernel adds split-K slices


class Gemma4MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, lin: LinearBuilder, prefix: str):
        super().__init__()
        self.gate_up_proj = lin.merged(f"{prefix}.gate_up_proj", hidden, [intermediate, intermediate])
        self.act = GeluTanhAndMul(intermediate)
        self.down_proj = lin.linear(f"{prefix}.down_proj", intermediate, hidden)

    def forward(self, x):
        """May return PartialSums: the layer's norm kernels add split-K slices."""
        return self.down_proj.forward_gated(self.gate_up_proj(x), self.act, summed=False)


class Gemma4Router(nn.Module):
    """norm(x) * scale * hidden^-0.5 -> proj -> the top-k experts (router_topk). The weightless norm and the two
    scalings are one norm whose weight is scale * hidden^-0.5 (norm_weight, made after loading), which the layer
    computes with its residual update: forward takes the normed x."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, lin: LinearBuilder, prefix: str):
        super().__init__()
        self.proj = lin.linear(f"{prefix}.proj", hidden, num_experts)
        self.scale = nn.Parameter(torch.empty(hidden), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.empty(num_experts), requires_grad=False)
        self.scale.weight_loader = self.per_expert_scale.weight_loader = copy_weight
        self.top_k, self.root_size = top_k, hidden ** -0.5
        self._topk = dispatch.choose("router_topk", experts=num_experts).fn
        # a plain bf16/fp16 projection goes into the one-launch router with the top-k; a quantized one runs apart
        self._route = dispatch.choose("router", experts=num_experts).fn if type(self.proj) is Linear else None
        self.register_buffer("norm_weight", None, persistent=False)

    def process_after_loading(self) -> None:
        self.norm_weight = (self.scale.float() * self.root_size).to(self.scale.dtype)

    def forward(self, normed):
        """normed: rms_norm(x, norm_weight)."""
        if self._route is not None:
            return self._route(normed, self.proj.weight, self.per_expert_scale, self.top_k)
        return self._topk(self.proj(normed), self.per_expert_scale, self.top_k)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: dict, layer, window, shares_kv: bool, lin: LinearBuilder, prefix: str,
                 key_rope: RotaryEmbedding | None = None):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = Gemma4Attention(cfg, layer, window, shares_kv, lin, f"{prefix}.self_attn", key_rope)
        wide = 2 if cfg.get("use_double_wide_mlp") and shares_kv else 1
        self.mlp = Gemma4MLP(hidden, cfg["intermediate_size"] * wide, lin, f"{prefix}.mlp")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(hidden, eps))
        self.layer_scalar = nn.Parameter(torch.empty(1), requires_grad=False)
        self.layer_scalar.weight_loader = copy_weight
        self.moe = bool(cfg.get("enable_moe_block"))
        if self.moe:
            self.router = Gemma4Router(hidden, cfg["num_experts"], cfg["top_k_experts"], lin, f"{prefix}.router")
            self.experts = lin.experts(f"{prefix}.experts", cfg["num_experts"], hidden, cfg["moe_intermediate_size"])
            self.experts.top_k = cfg["top_k_experts"]
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                         "pre_feedforward_layernorm_2"):
                setattr(self, name, RMSNorm(hidden, eps))
        self.ple_dim = cfg.get("hidden_size_per_layer_input") or 0
        if self.ple_dim:
            self.per_layer_input_gate = lin.linear(f"{prefix}.per_layer_input_gate", hidden, self.ple_dim)
            self.ple_act = nn.GELU(approximate="tanh")
            self.per_layer_projection = lin.linear(f"{prefix}.per_layer_projection", self.ple_dim, hidden)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)

    def forward(self, h, x, ple, cos, sin, ctx, next_norm: RMSNorm, next_linear: nn.Module | None):
        """h: the residual stream; x: input_layernorm(h). Returns the new h and next_norm(h) (the next layer's
        input norm, or the final norm), the latter computed with the residual update where it can be, and in the
        form next_linear (the linear that reads it, if one alone does) asks for."""
        attn = self.self_attn(x, cos, sin, ctx)
        if self.moe:  # the three feed-forward inputs are norms of the same sum: one pass computes them all
            then = (self.pre_feedforward_layernorm, self.router.norm_weight, self.pre_feedforward_layernorm_2)
            h, (x, routed, experts_in) = self.post_attention_layernorm.add_to_residual(
                attn, h, then=then, feeding=self.mlp.gate_up_proj)
        else:
            h, x = self.post_attention_layernorm.add_to_residual(attn, h, then=self.pre_feedforward_layernorm,
                                                                 feeding=self.mlp.gate_up_proj)
        if self.moe:
            # At decode the router is latency-bound: beside the MLP's weight stream its loads queue behind the
            # MLP's (measured 11.8 against 5 us alone), and the experts wait for it; so it runs first, alone. The
            # experts' chain of launches (gate_up, then down) then overlaps the MLP, which only streams weights.
            route = self.router(routed)
            experts, m = side_by_side(lambda: self.experts(experts_in, *route, summed=False),
                                      lambda: self.mlp(x), h.device, overlap=h.shape[0] <= OVERLAP_MAX_TOKENS)
            m = self.post_feedforward_layernorm_1.joined(m, self.post_feedforward_layernorm_2, experts)
        else:
            m = self.mlp(x)
        if not self.ple_dim:
            return self.post_feedforward_layernorm.add_to_residual(m, h, scale=self.layer_scalar, then=next_norm,
                                                                   feeding=next_linear)
        h, _ = self.post_feedforward_layernorm.add_to_residual(m, h)
        gated = self.ple_act(self.per_layer_input_gate(h)) * ple
        h = (h + self.post_per_layer_input_norm(self.per_layer_projection(gated))) * self.layer_scalar
        return h, next_norm(h)


class Gemma4Model(nn.Module):
    def __init__(self, spec: ModelSpec, max_positions: int):
        super().__init__()
        cfg = spec.hf
        if cfg.get("attention_bias"):
            raise ConfigError("attention_bias=true is not supported for Gemma 4")
        hidden = cfg["hidden_size"]
        kinds = [layer.kind for layer in spec.layers]
        self.share_targets = kv_share_targets(kinds, cfg.get("num_kv_shared_layers") or 0)
        self.window = cfg.get("sliding_window")
        lin = LinearBuilder(cfg)
        self.embed_tokens = ScaledEmbedding(cfg["vocab_size"], hidden, math.sqrt(hidden))
        self.ropes = self._build_ropes(spec, max_positions)
        self.key_from_value = self._key_from_value_layers(spec)
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(cfg, layer, self.window if layer.kind == "sliding" else None,
                               i in self.share_targets, lin, f"model.layers.{i}",
                               self.ropes[layer.kind] if i in self.key_from_value else None)
            for i, layer in enumerate(spec.layers))
        self.norm = RMSNorm(hidden, cfg.get("rms_norm_eps", 1e-6))
        self.ple_dim = cfg.get("hidden_size_per_layer_input") or 0
        if self.ple_dim:
            self._build_per_layer_embeddings(cfg, len(spec.layers), lin)
        self.kinds = kinds

    @staticmethod
    def _build_ropes(spec: ModelSpec, max_positions: int) -> nn.ModuleDict:
        ropes = nn.ModuleDict()
        for kind in sorted({layer.kind for layer in spec.layers}):
            head_dim = next(layer.head_dim for layer in spec.layers if layer.kind == kind)
            inv_freq = inv_freq_from_params(head_dim, spec.rope_parameters(kind))
            ropes[kind] = RotaryEmbedding(head_dim, inv_freq, max_positions)
        return ropes

    def _key_from_value_layers(self, spec: ModelSpec) -> set[int]:
        """k_eq_v layers store V alone (K = rope(V * w_k)), unless a KV-sharing layer reads their cache: that
        layer has no w_k of its own."""
        read_by_others = set(self.share_targets.values())
        return {i for i, layer in enumerate(spec.layers)
                if layer.k_eq_v and i not in self.share_targets and i not in read_by_others}

    def _build_per_layer_embeddings(self, cfg: dict, num_layers: int, lin: LinearBuilder) -> None:
        hidden, dim = cfg["hidden_size"], self.ple_dim
        vocab = cfg.get("vocab_size_per_layer_input", cfg["vocab_size"])
        self.embed_tokens_per_layer = ScaledEmbedding(vocab, num_layers * dim, dim ** 0.5)
        self.per_layer_model_projection = lin.linear("model.per_layer_model_projection", hidden, num_layers * dim)
        self.per_layer_projection_norm = RMSNorm(dim, cfg.get("rms_norm_eps", 1e-6))

    def per_layer_inputs(self, ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """PLE: a token-identity embedding plus a projection of the main embedding, one slice per layer."""
        shape = (ids.shape[0], len(self.layers), self.ple_dim)
        tokens = self.embed_tokens_per_layer(ids).reshape(shape)
        context = (self.per_layer_model_projection(embeds) * embeds.shape[-1] ** -0.5).reshape(shape)
        return (self.per_layer_projection_norm(context) + tokens) * 2.0 ** -0.5

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = self.embed_tokens(ids)
        ple = self.per_layer_inputs(ids, h) if self.ple_dim else None
        cos_sin = {kind: rope.cos_sin(ctx.positions, h.dtype) for kind, rope in self.ropes.items()}
        x = self.layers[0].input_layernorm(h)
        following = [(layer.input_layernorm, layer.self_attn.input_linear) for layer in self.layers[1:]]
        for i, (layer, (next_norm, next_linear)) in enumerate(zip(self.layers, following + [(self.norm, None)])):
            h, x = layer(h, x, None if ple is None else ple[:, i], *cos_sin[self.kinds[i]], ctx, next_norm,
                         next_linear)
        return x


class Gemma4ForCausalLM(nn.Module):
    # checkpoint name fragment -> (parameter name fragment, shard) for projections stored fused here
    packed_weights = {"mlp.gate_proj": ("mlp.gate_up_proj", 0), "mlp.up_proj": ("mlp.gate_up_proj", 1),
                      "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
                      "self_attn.v_proj": ("self_attn.qkv_proj", 2)}
    # Quark's MXFP4 export keeps one tensor per expert: experts.E.{gate,up,down}_proj.{weight,weight_scale}
    per_expert_tensor = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.(weight|weight_scale)$")
    # Quark's fp8 KV cache scales: one per layer for K and for V (quant.quark.KVCacheQuant)
    kv_scale_tensor = re.compile(r"model\.layers\.(\d+)\.self_attn\.(k|v)_proj\.output_scale$")
    skipped_prefixes = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                        "vision_tower.", "audio_tower.", "multi_modal_projector.")

    def __init__(self, spec: ModelSpec, max_positions: int):
        super().__init__()
        self.spec = spec
        self.model = Gemma4Model(spec, max_positions)
        self.softcap = spec.hf.get("final_logit_softcapping")
        self._logits_linear = dispatch.choose("linear", n=spec.hf["vocab_size"], k=spec.hf["hidden_size"]).fn

    def kv_specs(self, dtype: torch.dtype) -> list[KVSpec]:
        specs = []
        for i, layer in enumerate(self.spec.layers):
            if i in self.model.share_targets:
                specs.append(KVSpec("shared", target=self.model.share_targets[i]))
            else:
                window = self.model.window if layer.kind == "sliding" else None
                specs.append(KVSpec(layer.kind, layer.num_kv_heads, layer.head_dim, dtype, window,
                                    k_from_v=i in self.model.key_from_value))
        return specs

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def stacked_weight(self, name: str) -> tuple[str, int] | None:
        """A per-expert checkpoint tensor -> (stacked parameter, shard), see MXFP4Experts; else None."""
        match = self.per_expert_tensor.match(name)
        if match is None:
            return None
        prefix, expert, proj, kind = match.groups()
        stacked = "down_proj" if proj == "down" else "gate_up_proj"
        shard = int(expert) if proj == "down" else 2 * int(expert) + (proj == "up")
        return f"{prefix}.{stacked}{'_scale' if kind == 'weight_scale' else ''}", shard

    def kv_scale_target(self, name: str) -> tuple[int, str] | None:
        """A checkpoint's KV cache scale -> (layer, "k" or "v"); else None."""
        match = self.kv_scale_tensor.match(name)
        return (int(match.group(1)), match.group(2)) if match else None

    def ignored_weight(self, name: str) -> bool:
        """Checkpoint tensors this model never reads: towers, the tied lm_head, K/V of KV-sharing layers."""
        if name.startswith(self.skipped_prefixes) or name == "lm_head.weight":
            return True
        parts = name.split(".")
        if len(parts) > 4 and parts[1] == "layers" and parts[3] == "self_attn":
            shares = int(parts[2]) in self.model.share_targets
            return shares and parts[4] in ("k_proj", "v_proj", "k_norm", "v_norm")
        return False

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(ids, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._logits_linear(hidden, self.model.embed_tokens.weight)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
