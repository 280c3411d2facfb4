"""The Gemma 4 assistant (MTP drafter, transformers' Gemma4AssistantForCausalLM): a small decoder that proposes the
tokens after a sequence's newest one, reading the target's KV cache instead of keeping its own.

One draft step, per sequence: pre_projection over [the target's scaled embedding of the newest token, the target's
final hidden state of the position before it], then decoder layers that all share KV (each attends over the cache of
the target's last layer of its kind), the final norm, and post_projection back to the target's width, which the next
draft step takes in place of the target's hidden state. Every step of a round sits at the newest token's position p
and sees the target's keys 0..p-1, as in transformers' SinglePositionMultiTokenCandidateGenerator.
"""
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from atomlite.config import LayerAttention, ModelSpec, checkpoint_dtype, checkpoint_folder, read_json
from atomlite.errors import ConfigError
from atomlite.hub import fetch_weights
from atomlite.loader import load_dummy_weights, load_weights, resolve
from atomlite.model_ops import dispatch
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.context import ForwardContext
from atomlite.model_ops.embedding import ScaledEmbedding
from atomlite.model_ops.fusion import link
from atomlite.model_ops.linear import copy_weight
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.norm import Residual, RMSNorm
from atomlite.models.construction import default_dtype
from atomlite.models.gemma4 import Gemma4ForCausalLM, ropes_by_kind
from atomlite.models.gemma4_config import layout
from atomlite.models.gemma4_layers import Gemma4DecoderLayer, decoder_dataflow

ASSISTANT_MODEL_TYPE = "gemma4_assistant"
KV_TENSORS = ("k_proj", "v_proj", "k_norm", "v_norm")


@dataclass
class AssistantSpec:
    """An assistant checkpoint: its decoder (`text`, from its text_config) and the fields of its own config
    (defaults as transformers' Gemma4AssistantConfig)."""
    text: ModelSpec
    backbone_hidden_size: int = 1536  # the hidden size of the target it drafts for
    use_ordered_embeddings: bool = False
    num_centroids: int = 2048
    centroid_intermediate_top_k: int = 32


def load_assistant_spec(path: str | Path) -> AssistantSpec:
    """The spec of an assistant checkpoint folder, or of a hub repo id (org/name) when no such folder exists."""
    folder, repo_id = checkpoint_folder(path)
    if not folder.is_dir():
        raise ConfigError(f"assistant folder {folder} does not exist: pass a Gemma 4 assistant checkpoint folder or "
                          f"hub repo id (e.g. google/gemma-4-E2B-it-assistant)")
    config = folder / "config.json"
    raw = read_json(config)
    if raw.get("model_type") != ASSISTANT_MODEL_TYPE or not isinstance(raw.get("text_config"), dict):
        raise ConfigError(f"{config} has model_type {raw.get('model_type')!r}: an assistant checkpoint has model_type "
                          f"{ASSISTANT_MODEL_TYPE!r} and a text_config; pass the target's assistant (e.g. "
                          f"google/gemma-4-E2B-it-assistant)")
    text = dict(raw["text_config"])
    try:
        text_layout = layout(text)
    except KeyError as e:
        raise ConfigError(f"{config} text_config lacks {e.args[0]!r}") from None
    own = {f.name: raw[f.name] for f in fields(AssistantSpec) if f.name != "text" and f.name in raw}
    model = ModelSpec(folder, "Gemma4AssistantForCausalLM", text, text_layout.layers, checkpoint_dtype(raw, text),
                      False, repo_id, rope=text_layout.rope)
    spec = AssistantSpec(model, **own)
    _check_assistant(spec, config)
    return spec


def _check_assistant(spec: AssistantSpec, config: Path) -> None:
    text = spec.text.hf
    if text.get("hidden_size_per_layer_input"):
        raise ConfigError(f"{config}: an assistant with per-layer inputs (hidden_size_per_layer_input) is not supported")
    if text.get("num_kv_shared_layers") not in (None, 0, text["num_hidden_layers"]):
        raise ConfigError(f"{config}: every assistant layer must read the target's KV (num_kv_shared_layers = "
                          f"num_hidden_layers), got {text['num_kv_shared_layers']} of {text['num_hidden_layers']}")
    if spec.use_ordered_embeddings and (text["vocab_size"] % spec.num_centroids
                                        or not 0 < spec.centroid_intermediate_top_k <= spec.num_centroids):
        raise ConfigError(f"{config}: ordered embeddings need vocab_size ({text['vocab_size']}) divisible by "
                          f"num_centroids ({spec.num_centroids}) and 0 < centroid_intermediate_top_k <= num_centroids")


def check_compatible(spec: AssistantSpec, target: ModelSpec) -> None:
    """ConfigError unless the assistant was made for a target of this shape (config.json alone: before any weight
    is read)."""
    text, target_hf = spec.text.hf, target.hf
    where = f"assistant {spec.text.path}"
    if spec.backbone_hidden_size != target_hf["hidden_size"]:
        raise ConfigError(f"{where} drafts for a target of hidden size {spec.backbone_hidden_size}, but the target has "
                          f"{target_hf['hidden_size']}: use the assistant released with this target model")
    if text["vocab_size"] != target_hf["vocab_size"]:
        raise ConfigError(f"{where} has vocab_size {text['vocab_size']}, the target {target_hf['vocab_size']}: use "
                          f"the assistant released with this target model")
    missing = sorted({layer.kind for layer in spec.text.layers} - {layer.kind for layer in target.layers})
    if missing:
        raise ConfigError(f"{where} has {', '.join(missing)} attention layers, whose KV it reads from the target's "
                          f"layers of that kind, but the target has none")


def kv_owner(target: Gemma4ForCausalLM, kind: str) -> int:
    """The target layer that owns the cache an assistant layer of `kind` reads: that of the target's last layer of
    the kind (itself, or the layer it shares KV with)."""
    last = max(i for i, k in enumerate(target.model.kinds) if k == kind)
    return target.model.share_targets.get(last, last)


class MaskedEmbedding(nn.Module):
    """Logits of the tokens of the top centroids only (use_ordered_embeddings). token_ordering lists the vocabulary
    centroid by centroid, vocab / num_centroids tokens each. Every other token gets one less than the row's lowest
    computed logit: transformers' value, except that it takes the minimum over the whole batch (per row keeps rows
    independent of each other)."""

    def __init__(self, spec: AssistantSpec, lin: LinearBuilder):
        super().__init__()
        hidden, vocab = spec.text.hf["hidden_size"], spec.text.hf["vocab_size"]
        self.centroids = lin.linear("masked_embedding.centroids", hidden, spec.num_centroids)
        self.token_ordering = nn.Parameter(torch.empty(vocab, dtype=torch.long), requires_grad=False)
        self.token_ordering.weight_loader = copy_weight
        self.num_centroids, self.top_k = spec.num_centroids, spec.centroid_intermediate_top_k

    def forward(self, normed: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        top = torch.topk(self.centroids(normed), self.top_k, dim=-1).indices
        tokens = self.token_ordering.view(self.num_centroids, -1)[top].flatten(1)  # [B, top_k * tokens per centroid]
        selected = torch.einsum("bd,bnd->bn", normed, embeddings[tokens])
        logits = (selected.amin(dim=-1, keepdim=True) - 1).expand(-1, embeddings.shape[0]).contiguous()
        return logits.scatter_(1, tokens, selected)


class Gemma4AssistantModel(nn.Module):
    """The assistant's decoder: layers that all read the target's caches, and the final norm."""

    def __init__(self, spec: ModelSpec, target: Gemma4ForCausalLM, owners: list[int], max_positions: int):
        super().__init__()
        cfg = spec.hf
        if cfg.get("attention_bias"):
            raise ConfigError("attention_bias=true is not supported for Gemma 4")
        hidden = cfg["hidden_size"]
        lin = LinearBuilder(cfg)
        # read only as the tied lm_head: the input is the target's embedding
        self.embed_tokens = ScaledEmbedding(cfg["vocab_size"], hidden, math.sqrt(hidden))
        self.ropes = ropes_by_kind(spec, max_positions)
        self.layers = nn.ModuleList(self._reading_layer(cfg, layer, i, target, owner, lin)
                                    for i, (layer, owner) in enumerate(zip(spec.layers, owners)))
        self.norm = RMSNorm(hidden, cfg.get("rms_norm_eps", 1e-6))
        self.kinds = [layer.kind for layer in spec.layers]

    @staticmethod
    def _reading_layer(cfg: dict, layer: LayerAttention, index: int, target: Gemma4ForCausalLM, owner: int,
                       lin: LinearBuilder) -> Gemma4DecoderLayer:
        """Layer `index`, attending over target layer `owner`'s cache: with that layer's KV heads and, where the
        cache holds V alone, the target's RoPE and k_norm to rebuild K."""
        cached = target.spec.layers[owner]
        if cached.head_dim != layer.head_dim or cfg["num_attention_heads"] % cached.num_kv_heads:
            raise ConfigError(f"assistant layer {index} ({layer.kind}, {cfg['num_attention_heads']} heads of "
                              f"{layer.head_dim}) cannot read target layer {owner}'s KV ({cached.num_kv_heads} heads "
                              f"of {cached.head_dim}): use the assistant released with this target model")
        # The target keeps the keys a query at p sees (p-W+1..p); the drafter's query at p sees keys < p: W - 1 of
        # them. transformers' flipped bidirectional mask sees a key or two more; shorter contexts are identical.
        window = target.model.window - 1 if layer.kind == "sliding" else None
        derives_k = owner in target.model.key_from_value
        key_rope = target.model.ropes[layer.kind] if derives_k else None
        key_norm = target.model.layers[owner].self_attn.k_norm if derives_k else None
        reading = LayerAttention(layer.kind, layer.head_dim, cached.num_kv_heads, k_eq_v=False)
        return Gemma4DecoderLayer(cfg, reading, window, True, lin, f"model.layers.{index}", key_rope, key_norm)

    def forward(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        cos_sin = {kind: rope.cos_sin(ctx.positions, h.dtype) for kind, rope in self.ropes.items()}
        residual = Residual(h)
        for layer, kind in zip(self.layers, self.kinds):
            residual = layer(residual, None, *cos_sin[kind], ctx)
        return residual.normed(self.norm)


class Gemma4AssistantForCausalLM(nn.Module):
    """The drafter. The engine binds each of attention_layers() to the cache of target layer target_kv_layers[i]
    and calls it with one query per sequence (see the module docstring); it writes no KV."""
    packed_weights = Gemma4ForCausalLM.packed_weights
    skipped_prefixes = ()

    def __init__(self, spec: AssistantSpec, target: Gemma4ForCausalLM, max_positions: int):
        super().__init__()
        check_compatible(spec, target.spec)
        cfg = spec.text.hf
        self.spec = spec
        self.target_kv_layers = [kv_owner(target, layer.kind) for layer in spec.text.layers]
        self.model = Gemma4AssistantModel(spec.text, target, self.target_kv_layers, max_positions)
        lin = LinearBuilder(cfg)
        hidden, backbone = cfg["hidden_size"], spec.backbone_hidden_size
        self.pre_projection = lin.linear("pre_projection", 2 * backbone, hidden)
        self.post_projection = lin.linear("post_projection", hidden, backbone)
        self.masked_embedding = MaskedEmbedding(spec, lin) if spec.use_ordered_embeddings else None
        self._logits_linear = dispatch.choose("linear", n=cfg["vocab_size"], k=hidden).fn
        self._target_embedding = (target.model.embed_tokens,)  # out of the module tree: the target loads it

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def ignored_weight(self, name: str) -> bool:
        """The tied lm_head, and K/V tensors a checkpoint may keep for layers that read the target's instead."""
        parts = name.split(".")
        return name == "lm_head.weight" or (len(parts) > 4 and parts[3] == "self_attn" and parts[4] in KV_TENSORS)

    def dataflow(self):
        return decoder_dataflow(self.model.layers, self.model.norm)

    def forward(self, ids: torch.Tensor, prev_hidden: torch.Tensor,
                ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [B]: each sequence's newest token; prev_hidden [B, backbone hidden]: the target's final hidden state
        of the position before it, or the previous draft step's projected output. -> (normed hidden [B, hidden]
        for compute_logits, projected hidden [B, backbone hidden] for the next step)."""
        embeds = self._target_embedding[0](ids)
        normed = self.model(self.pre_projection(torch.cat([embeds, prev_hidden], dim=-1)), ctx)
        return normed, self.post_projection(normed)

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        # transformers' assistant applies no final softcap, whatever its text_config says
        if self.masked_embedding is not None:
            return self.masked_embedding(normed, self.model.embed_tokens.weight)
        return self._logits_linear(normed, self.model.embed_tokens.weight)


def construct_assistant(spec: AssistantSpec, target: Gemma4ForCausalLM, device: torch.device | str,
                        dtype: torch.dtype, max_positions: int) -> Gemma4AssistantForCausalLM:
    """The assistant's modules on device, its parameters in dtype, linked (model_ops.fusion); kernels as the active
    dispatch.use block chooses them."""
    with torch.device(device), default_dtype(dtype):
        return link(Gemma4AssistantForCausalLM(spec, target, max_positions))


def build_assistant(spec: AssistantSpec, target: Gemma4ForCausalLM, device: torch.device | str, dtype: torch.dtype,
                    load_format: str = "auto", seed: int = 0,
                    max_positions: int | None = None) -> Gemma4AssistantForCausalLM:
    """The assistant with its weights (load_format "dummy": seeded random ones), for target; build it inside the
    target's dispatch.use block so that both get kernels for the same platform. max_positions: the target's."""
    if load_format not in ("auto", "dummy"):
        raise ConfigError(f"load format {load_format!r} is not one of auto, dummy")
    if max_positions is None:
        max_positions = next(iter(target.model.ropes.values())).cos_table.shape[0]
    model = construct_assistant(spec, target, device, dtype, max_positions)
    if load_format == "dummy":
        load_dummy_weights(model, seed)
        if model.masked_embedding is not None:  # the dummy fill's 1s would make every centroid list token 1
            ordering = model.masked_embedding.token_ordering
            ordering.copy_(torch.arange(ordering.numel(), device=ordering.device))
    else:
        if spec.text.repo_id is not None:
            fetch_weights(spec.text.repo_id, spec.text.path, lambda name: resolve(model, name) is not None)
        load_weights(model, spec.text.path)
    return model.eval()
