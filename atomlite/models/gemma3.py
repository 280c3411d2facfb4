"""Gemma 3 text decoder (transformers' Gemma3ForCausalLM, model_type gemma3_text; the text part of a
Gemma3ForConditionalGeneration checkpoint, its vision tower unread).

Sliding-window and global layers (layer_types, or every sliding_window_pattern-th layer global), each kind with its
own RoPE (rope_local_base_freq for sliding layers; rope_theta and rope_scaling, e.g. linear, for global ones); q and k
RMS-normed per head, V not; scores scaled by query_pre_attn_scalar^-0.5; the token embedding scaled by
sqrt(hidden_size); norms that multiply by (1 + w), loaded as that multiplier; logits optionally soft-capped
(final_logit_softcapping). attn_logit_softcapping is read by neither transformers' Gemma 3 nor this model: Gemma 3
replaced Gemma 2's attention soft-capping with the q/k norms, and the field only survives in its config class.
"""
import math

import torch
from torch import nn

from atomlite import distributed
from atomlite.config import LayerAttention, ModelLayout, ModelSpec, text_config
from atomlite.distributed import kv_heads_of_rank, split
from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.carriers import as_heads, merged_heads, split_columns
from atomlite.model_ops.context import ForwardContext
from atomlite.model_ops.embedding import token_embedding
from atomlite.model_ops.fusion import Feeds, NormedSum
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.model_ops.linear import copy_weight
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.mlp import GatedGeluMLP
from atomlite.model_ops.norm import Residual, RMSNorm
from atomlite.model_ops.rope import RotaryEmbedding, inv_freq_from_params

# transformers' Gemma3TextConfig defaults: hub configs (a Gemma3ForConditionalGeneration's text_config above all)
# leave many fields out
TEXT_DEFAULTS = dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
                     max_position_embeddings=131_072, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
                     bos_token_id=2, tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256,
                     sliding_window=4096, final_logit_softcapping=None, use_bidirectional_attention=False)
DEFAULT_THETA = {"sliding": 10_000.0, "full": 1_000_000.0}
LEGACY_THETA = {"sliding": "rope_local_base_freq", "full": "rope_theta"}
SUPPORTED_ROPE = ("default", "linear")
SPECIAL_TOKENS = ("eos_token_id", "bos_token_id", "pad_token_id")


def layer_kinds(text: dict) -> list[str]:
    """"sliding" or "full" per layer: layer_types, else every sliding_window_pattern-th layer (6th) global."""
    types = text.get("layer_types")
    if types is None:
        pattern = text.get("sliding_window_pattern", 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(text["num_hidden_layers"])]
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown or len(types) != text["num_hidden_layers"]:
        raise ConfigError(f"layer_types must name sliding_attention or full_attention for each of the "
                          f"{text['num_hidden_layers']} layers (got {len(types)}, unknown: {unknown or 'none'})")
    return ["full" if t == "full_attention" else "sliding" for t in types]


def rope_by_kind(text: dict) -> dict[str, dict]:
    """RoPE parameters per layer kind, read as transformers does: rope_parameters per layer type, else the legacy
    rope_local_base_freq (sliding), rope_theta and rope_scaling (global)."""
    given = text.get("rope_parameters") or {}
    if given and not {"sliding_attention", "full_attention"} & set(given):
        raise ConfigError(f"rope_parameters {given} must be given per layer type (sliding_attention, full_attention)")
    ropes = {}
    for kind in ("sliding", "full"):
        params = dict(given.get(f"{kind}_attention") or {})
        if kind == "full" and text.get("rope_scaling"):
            params.update(text["rope_scaling"])
        params["rope_type"] = params.get("rope_type", params.get("type", "default"))
        params.setdefault("rope_theta", text.get(LEGACY_THETA[kind], DEFAULT_THETA[kind]))
        if params["rope_type"] not in SUPPORTED_ROPE or params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError(f"{kind}_attention RoPE {params}: Gemma 3 runs rope_type {' or '.join(SUPPORTED_ROPE)} "
                              f"over the whole head")
        ropes[kind] = params
    return ropes


def check_text_config(text: dict) -> None:
    refused = {"attention_bias": "q/k/v/o biases", "use_bidirectional_attention": "bidirectional attention"}
    for key, what in refused.items():
        if text.get(key):
            raise ConfigError(f"{key}={text[key]}: {what} are not supported for Gemma 3")
    if text["hidden_activation"] != "gelu_pytorch_tanh":
        raise ConfigError(f"hidden_activation {text['hidden_activation']!r} is not supported for Gemma 3 (its MLP "
                          f"runs gelu_pytorch_tanh)")
    if not text["sliding_window"] or text["sliding_window"] < 1:
        raise ConfigError(f"sliding_window {text['sliding_window']!r} must be a positive number of tokens")
    if not text["tie_word_embeddings"]:
        raise ConfigError("tie_word_embeddings=false is not supported for Gemma 3: its logits read the embedding table")


def parse_config(raw: dict) -> ModelLayout:
    """A Gemma3ForCausalLM config.json, or a Gemma3ForConditionalGeneration's (its text_config; text only)."""
    multimodal = "text_config" in raw
    # a multimodal checkpoint may name its special tokens at the top level only
    tokens = {key: raw[key] for key in SPECIAL_TOKENS if multimodal and raw.get(key) is not None}
    text = {**TEXT_DEFAULTS, **tokens, **(text_config(raw) if multimodal else raw)}
    check_text_config(text)
    layers = [LayerAttention(kind, text["head_dim"], text["num_key_value_heads"], k_eq_v=False)
              for kind in layer_kinds(text)]
    return ModelLayout(text, layers, rope_by_kind(text), multimodal)


def load_one_plus(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """Gemma 3's norms multiply by (1 + w): kept as that multiplier, added in fp32 and rounded once."""
    copy_weight(param, (1.0 + loaded.float()).to(param.dtype))


def gemma3_norm(dim: int, eps: float) -> RMSNorm:
    norm = RMSNorm(dim, eps)
    norm.weight.weight_loader = load_one_plus
    return norm


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: dict, layer: LayerAttention, window: int | None, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, self.head_dim = cfg["hidden_size"], layer.head_dim
        heads = split(cfg["num_attention_heads"], lin.tp.rank, lin.tp.size, "num_attention_heads")
        kv_heads = kv_heads_of_rank(layer.num_kv_heads, cfg["num_attention_heads"], lin.tp.rank, lin.tp.size,
                                    "num_key_value_heads")
        self.num_kv_heads = kv_heads.size
        rows = [heads.scaled(self.head_dim), kv_heads.scaled(self.head_dim), kv_heads.scaled(self.head_dim)]
        self.qkv_sizes = [r.size for r in rows]
        parts = [f"{prefix}.{name}" for name in ("q_proj", "k_proj", "v_proj")]
        self.fused_qkv = lin.can_fuse(parts)
        if self.fused_qkv:
            self.qkv_proj = lin.merged(f"{prefix}.qkv_proj", hidden, [r.total for r in rows], parts, rows)
        else:  # the checkpoint quantizes q, k and v differently
            self.q_proj, self.k_proj, self.v_proj = (lin.linear(part, hidden, r.total, r)
                                                     for part, r in zip(parts, rows))
        eps = cfg["rms_norm_eps"]
        self.q_norm, self.k_norm = gemma3_norm(self.head_dim, eps), gemma3_norm(self.head_dim, eps)
        self.o_proj = lin.row_parallel(f"{prefix}.o_proj", heads.scaled(self.head_dim), hidden)
        self.attn = Attention(heads.size, kv_heads.size, self.head_dim, scale=cfg["query_pre_attn_scalar"] ** -0.5,
                              window=window, value_norm=False)

    @property
    def input_linear(self) -> nn.Module | None:
        return self.qkv_proj if self.fused_qkv else None

    def dataflow(self):
        if self.fused_qkv:
            yield Feeds(self.qkv_proj, self.attn)
        yield Feeds(self.attn, self.o_proj)

    def forward(self, x, cos, sin, ctx: ForwardContext):
        if self.fused_qkv:
            q, k, v = split_columns(self.qkv_proj(x), self.qkv_sizes)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = (as_heads(t, self.head_dim) for t in (q, k, v))
        out = self.attn.forward_raw(q, k, v, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin, ctx)
        return self.o_proj(merged_heads(out))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict, layer: LayerAttention, window: int | None, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden = cfg["hidden_size"]
        self.self_attn = Gemma3Attention(cfg, layer, window, lin, f"{prefix}.self_attn")
        self.mlp = GatedGeluMLP(hidden, cfg["intermediate_size"], lin, f"{prefix}.mlp")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, gemma3_norm(hidden, cfg["rms_norm_eps"]))

    def dataflow(self, next_norm: RMSNorm, next_reader: nn.Module | None):
        """model_ops.fusion's edges: next_norm normalizes this layer's output next, read by next_reader."""
        yield from self.self_attn.dataflow()
        yield from self.mlp.dataflow()
        yield Feeds(self.self_attn.o_proj, self.post_attention_layernorm)
        yield NormedSum(self.post_attention_layernorm, (self.pre_feedforward_layernorm,), self.mlp.gate_up_proj)
        yield Feeds(self.mlp.down_proj, self.post_feedforward_layernorm)
        yield NormedSum(self.post_feedforward_layernorm, (next_norm,), next_reader)

    def forward(self, h: Residual, cos, sin, ctx: ForwardContext) -> Residual:
        attn = self.self_attn(h.normed(self.input_layernorm), cos, sin, ctx)
        h = self.post_attention_layernorm.add_to_residual(attn, h.stream)
        m = self.mlp(h.normed(self.pre_feedforward_layernorm))
        return self.post_feedforward_layernorm.add_to_residual(m, h.stream)


class Gemma3Model(nn.Module):
    def __init__(self, spec: ModelSpec, max_positions: int):
        super().__init__()
        cfg, hidden = spec.hf, spec.hf["hidden_size"]
        lin = LinearBuilder(cfg)
        self.embed_tokens = token_embedding(cfg["vocab_size"], hidden, math.sqrt(hidden), lin.tp)
        self.kinds = [layer.kind for layer in spec.layers]
        self.window = cfg["sliding_window"]
        self.ropes = nn.ModuleDict({
            kind: RotaryEmbedding(cfg["head_dim"], inv_freq_from_params(cfg["head_dim"], spec.rope_parameters(kind)),
                                  max_positions)
            for kind in sorted(set(self.kinds))})
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, layer, self.window if layer.kind == "sliding" else None, lin, f"model.layers.{i}")
            for i, layer in enumerate(spec.layers))
        self.norm = gemma3_norm(hidden, cfg["rms_norm_eps"])

    def dataflow(self):
        following = [(layer.input_layernorm, layer.self_attn.input_linear) for layer in self.layers[1:]]
        for layer, (next_norm, next_reader) in zip(self.layers, following + [(self.norm, None)]):
            yield from layer.dataflow(next_norm, next_reader)

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = self.embed_tokens(ids)
        cos_sin = {kind: rope.cos_sin(ctx.positions, h.dtype) for kind, rope in self.ropes.items()}
        residual = Residual(h)
        for kind, layer in zip(self.kinds, self.layers):
            residual = layer(residual, *cos_sin[kind], ctx)
        return residual.normed(self.norm)


class Gemma3ForCausalLM(nn.Module):
    parse_config = staticmethod(parse_config)
    # checkpoint name fragment -> (parameter name fragment, shard) for projections stored fused here
    packed_weights = {"mlp.gate_proj": ("mlp.gate_up_proj", 0), "mlp.up_proj": ("mlp.gate_up_proj", 1),
                      "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
                      "self_attn.v_proj": ("self_attn.qkv_proj", 2)}
    # a Gemma3ForConditionalGeneration checkpoint: its tower and projector, unread (both naming schemes)
    skipped_prefixes = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                        "model.multi_modal_projector.")
    checkpoint_aliases = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))

    def __init__(self, spec: ModelSpec, max_positions: int):
        super().__init__()
        self.spec = spec
        self.model = Gemma3Model(spec, max_positions)
        self.softcap = spec.hf["final_logit_softcapping"]
        self.tp = distributed.current()
        self._logits_linear = dispatch.choose("linear", n=self.logits_weight.shape[0], k=spec.hf["hidden_size"]).fn

    def kv_specs(self, dtype: torch.dtype) -> list[KVSpec]:
        """One per layer; the KV heads are this rank's."""
        return [KVSpec(layer.kind, decoder.self_attn.num_kv_heads, layer.head_dim, dtype,
                       self.model.window if layer.kind == "sliding" else None)
                for layer, decoder in zip(self.spec.layers, self.model.layers)]

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    @property
    def logits_weight(self) -> torch.Tensor:
        """The tied embedding table (this rank's rows)."""
        return self.model.embed_tokens.weight

    def ignored_weight(self, name: str) -> bool:
        return name == "lm_head.weight"  # tied to the embedding

    def dataflow(self):
        return self.model.dataflow()

    def forward(self, ids: torch.Tensor, ctx: ForwardContext, mm_embeds=None) -> torch.Tensor:
        if mm_embeds is not None:
            raise ConfigError(f"{self.spec.path}: Gemma 3 runs text only here (no vision tower)")
        return self.model(ids, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.tp.all_gather_last(self._logits_linear(hidden, self.logits_weight))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
