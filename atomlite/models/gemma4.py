"""Gemma 4 text decoder: dense (31B), MoE (26B-A4B) and per-layer-embedding + KV-sharing (E2B/E4B) variants, with the
vision tower of a multimodal checkpoint (models/gemma4_vision.py) whose soft tokens a forward step can take in place
of some token rows.

Math per shared/docs/GEMMA4.md, checked against transformers' modeling_gemma4.py. The model declares its KV
specs and weight names; batching details reach it only through the ForwardContext.
"""
import math
import re
from collections.abc import Sequence

import torch
from torch import nn

from atomlite import distributed
from atomlite.config import AudioSpec, ModelSpec, VisionSpec
from atomlite.errors import ConfigError
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.model_ops import dispatch
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.context import ForwardContext
from atomlite.model_ops.embedding import ScaledEmbedding, token_embedding
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.multimodal import MultiModalEmbeds
from atomlite.model_ops.norm import Residual, RMSNorm
from atomlite.model_ops.rope import RotaryEmbedding, inv_freq_from_params
from atomlite.models import gemma4_config
from atomlite.models.gemma4_layers import Gemma4DecoderLayer, decoder_dataflow
from atomlite.models import gemma4_audio
from atomlite.models.gemma4_audio import Gemma4AudioTower
from atomlite.models.gemma4_vision import PROJECTOR_PREFIX, TOWER_PREFIX, Gemma4VisionTower

VISION_PREFIXES = (f"{TOWER_PREFIX}.", f"{PROJECTOR_PREFIX}.")
AUDIO_PREFIXES = (f"{gemma4_audio.TOWER_PREFIX}.", f"{gemma4_audio.PROJECTOR_PREFIX}.")


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


def ropes_by_kind(spec: ModelSpec, max_positions: int) -> nn.ModuleDict:
    """One RotaryEmbedding per attention kind of spec's layers."""
    ropes = nn.ModuleDict()
    for kind in sorted({layer.kind for layer in spec.layers}):
        head_dim = next(layer.head_dim for layer in spec.layers if layer.kind == kind)
        inv_freq = inv_freq_from_params(head_dim, spec.rope_parameters(kind))
        ropes[kind] = RotaryEmbedding(head_dim, inv_freq, max_positions)
    return ropes


def image_spans_bidirectional(spec: ModelSpec) -> bool:
    """Whether an image's soft tokens see each other both ways: under use_bidirectional_attention "vision", on the
    sliding layers only (transformers' create_masks_for_vision_model; the full layers stay causal)."""
    if spec.vision is None:
        return False
    mode = spec.vision.use_bidirectional_attention
    if mode not in (None, "vision"):
        raise ConfigError(f"use_bidirectional_attention {mode!r} is not supported for Gemma 4; it takes null or "
                          f"\"vision\"")
    return mode == "vision"


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
        self.embed_tokens = token_embedding(cfg["vocab_size"], hidden, math.sqrt(hidden), lin.tp)
        self.ropes = ropes_by_kind(spec, max_positions)
        self.key_from_value = self._key_from_value_layers(spec)
        self.image_spans_bidirectional = image_spans_bidirectional(spec)
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(cfg, layer, self.window if layer.kind == "sliding" else None,
                               i in self.share_targets, lin, f"model.layers.{i}",
                               self.ropes[layer.kind] if i in self.key_from_value else None,
                               bidirectional_spans=self.image_spans_bidirectional and layer.kind == "sliding")
            for i, layer in enumerate(spec.layers))
        self.norm = RMSNorm(hidden, cfg.get("rms_norm_eps", 1e-6))
        self.ple_dim = cfg.get("hidden_size_per_layer_input") or 0
        if self.ple_dim:
            self._build_per_layer_embeddings(cfg, len(spec.layers), lin)
        self.kinds = kinds
        self.pad_token_id = cfg.get("pad_token_id") or 0

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

    def dataflow(self):
        return decoder_dataflow(self.layers, self.norm)

    def forward(self, ids: torch.Tensor, ctx: ForwardContext,
                mm_embeds: MultiModalEmbeds | None = None) -> torch.Tensor:
        if mm_embeds is not None:  # soft-token rows read the pad token wherever the text side looks ids up (PLE)
            ids = mm_embeds.with_pad_ids(ids, self.pad_token_id)
        h = self.embed_tokens(ids)
        if mm_embeds is not None:
            h = mm_embeds.placed_in(h)
        ple = self.per_layer_inputs(ids, h) if self.ple_dim else None
        cos_sin = {kind: rope.cos_sin(ctx.positions, h.dtype) for kind, rope in self.ropes.items()}
        residual = Residual(h)
        for i, layer in enumerate(self.layers):
            residual = layer(residual, None if ple is None else ple[:, i], *cos_sin[self.kinds[i]], ctx)
        return residual.normed(self.norm)


class Gemma4ForCausalLM(nn.Module):
    parse_config = staticmethod(gemma4_config.parse_config)  # config.json -> ModelLayout
    mtp_assistant = "atomlite.models.gemma4_assistant"  # its MTP drafter (speculative_config method "mtp")
    # checkpoint name fragment -> (parameter name fragment, shard) for projections stored fused here
    packed_weights = {"mlp.gate_proj": ("mlp.gate_up_proj", 0), "mlp.up_proj": ("mlp.gate_up_proj", 1),
                      "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
                      "self_attn.v_proj": ("self_attn.qkv_proj", 2)}
    # Quantized exports (Quark MXFP4 and FP8, compressed-tensors FP8) keep one tensor per expert:
    # experts.E.{gate,up,down}_proj.{weight,weight_scale,input_scale}
    per_expert_tensor = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.(weight|weight_scale|input_scale)$")
    _stacked_suffix = {"weight": "", "weight_scale": "_scale", "input_scale": "_input_scale"}
    # Quark's fp8 KV cache scales: one per layer for K and for V (quant.quark.KVCacheQuant)
    kv_scale_tensor = re.compile(r"model\.layers\.(\d+)\.self_attn\.(k|v)_proj\.output_scale$")
    # tensors of towers this model has not: the vision (audio) tower's where config.json has no vision (audio)_config
    skipped_prefixes = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                        "vision_tower.", "audio_tower.", "multi_modal_projector.")
    checkpoint_aliases = ((f"{TOWER_PREFIX}.", "vision."), (f"{PROJECTOR_PREFIX}.", "vision.projector."),
                          (AUDIO_PREFIXES[0], "audio."), (AUDIO_PREFIXES[1], "audio.projector."))
    # the projections LoRA adapters may change (checkpoint names), in the decoder layers (atomlite.lora.targets);
    # the MoE experts' adapters (PEFT's target_parameters) are refused
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora_prefix = "model.layers."

    def __init__(self, spec: ModelSpec, max_positions: int):
        super().__init__()
        self.spec = spec
        self.model = Gemma4Model(spec, max_positions)
        self.softcap = spec.hf.get("final_logit_softcapping")
        self.tp = distributed.current()
        vocab_rows = self.model.embed_tokens.weight.shape[0]  # this rank's part of the vocabulary
        self._logits_linear = dispatch.choose("linear", n=vocab_rows, k=spec.hf["hidden_size"]).fn
        self.vision = None
        if spec.vision is not None:  # replicated: every tensor-parallel rank builds and runs the whole tower
            self.vision = Gemma4VisionTower(spec.vision.hf, spec.hf["hidden_size"], LinearBuilder(spec.hf))
            self.skipped_prefixes = tuple(p for p in self.skipped_prefixes if p not in VISION_PREFIXES)
        self.audio = None
        if spec.audio is not None:  # replicated, as the vision tower
            self.audio = Gemma4AudioTower(spec.audio.hf, spec.hf["hidden_size"], LinearBuilder(spec.hf))
            self.skipped_prefixes = tuple(p for p in self.skipped_prefixes if p not in AUDIO_PREFIXES)

    @property
    def image_spans_bidirectional(self) -> bool:
        """Whether a step with image soft tokens needs their key ends (ForwardContext.key_ends): some layers let an
        image's tokens see the whole image."""
        return self.model.image_spans_bidirectional

    @property
    def vision_spec(self) -> VisionSpec | None:
        """What placing images in a prompt needs (token ids, bidirectional attention, PLE's pad id); None without a
        vision tower."""
        return self.spec.vision

    def embed_images(self, pixel_values: Sequence[torch.Tensor] | torch.Tensor,
                     position_ids: Sequence[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
        """Each image's (or video frame's) soft tokens [soft tokens, hidden], from the Gemma 4 image processor's
        pixel_values and image_position_ids (per image [patches, 3 * patch^2] and [patches, 2], padding rows at
        (-1, -1); a list of them or the processor's batch)."""
        if self.vision is None:
            raise ConfigError(f"{self.spec.path} has no vision tower (its config.json has no vision_config): it "
                              f"takes text only")
        return self.vision.encode(pixel_values, position_ids)

    @property
    def encoder_placeholders(self) -> dict[str, int]:
        """The modalities its towers take, each with the placeholder token its soft tokens stand in for."""
        placeholders = {}
        if self.vision is not None:
            placeholders.update(image=self.spec.vision.image_token_id, video=self.spec.vision.video_token_id)
        if self.audio is not None:
            placeholders["audio"] = self.spec.audio.audio_token_id
        return placeholders

    @property
    def bidirectional_modalities(self) -> tuple[str, ...]:
        """The items whose soft tokens see each other both ways (transformers' mm_token_type_ids 1 and 2: images and
        video frames, under use_bidirectional_attention "vision"); a clip's attend causally."""
        return ("image", "video") if self.image_spans_bidirectional else ()

    def embed_items(self, modalities: Sequence[str], inputs: Sequence[tuple]) -> list[torch.Tensor]:
        """Soft tokens of several items, in order: each item's tower_inputs (multimodal.inputs) by its modality;
        each tower runs once."""
        out: list[torch.Tensor | None] = [None] * len(inputs)
        clips = [i for i, modality in enumerate(modalities) if modality == "audio"]
        frames = [i for i, modality in enumerate(modalities) if modality != "audio"]
        if clips:
            for i, soft_tokens in zip(clips, self.embed_audio([inputs[i][0] for i in clips])):
                out[i] = soft_tokens
        if frames:
            encoded = self.embed_images([inputs[i][0] for i in frames], [inputs[i][1] for i in frames])
            for i, soft_tokens in zip(frames, encoded):
                out[i] = soft_tokens
        return out

    @property
    def audio_spec(self) -> AudioSpec | None:
        """What placing audio clips in a prompt needs (token ids, PLE's pad id); None without an audio tower."""
        return self.spec.audio

    def embed_audio(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each clip's soft tokens [soft tokens, hidden], from the Gemma 4 audio feature extractor's log-mel
        features cut to the clip's frames ([frames, 128] each)."""
        if self.audio is None:
            raise ConfigError(f"{self.spec.path} has no audio tower (its config.json has no audio_config)")
        return self.audio.encode(features)

    def use_image_graphs(self, max_soft_tokens: int, capture: bool = True):
        """embed_images of up to max_soft_tokens soft tokens a call from graphs at bucketed patch counts (see
        gemma4_vision_graphs; capture=False: eagerly from the same padded buffers); returns its TowerGraphs."""
        graphs = self.vision.use_graphs(max_soft_tokens, capture)
        if capture:
            graphs.capture_all()
        return graphs

    def use_audio_graphs(self, max_soft_tokens: int, capture: bool = True):
        """embed_audio of clips of up to max_soft_tokens soft tokens from graphs at bucketed frame counts, one clip a
        replay (see gemma4_audio_graphs; capture=False: eagerly from the same padded buffers); returns its
        ClipGraphs."""
        graphs = self.audio.use_graphs(max_soft_tokens)
        if capture:
            graphs.capture_all()
        return graphs

    def image_graphs_off_reason(self) -> str | None:
        """Why the tower cannot run from graphs; None when it can."""
        attention = self.vision.encoder.layers[0].self_attn.attn.kernel
        if not attention.can("graphs_packed_sequences"):
            return f"{attention.backend} encoder attention reads the images' lengths on the host"
        return None

    def kv_specs(self, dtype: torch.dtype) -> list[KVSpec]:
        """One per layer; the KV heads are this rank's (all of them in a single process)."""
        specs = []
        for i, (layer, decoder) in enumerate(zip(self.spec.layers, self.model.layers)):
            if i in self.model.share_targets:
                specs.append(KVSpec("shared", target=self.model.share_targets[i]))
            else:
                window = self.model.window if layer.kind == "sliding" else None
                specs.append(KVSpec(layer.kind, decoder.self_attn.num_kv_heads, layer.head_dim, dtype, window,
                                    k_from_v=i in self.model.key_from_value))
        return specs

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    @property
    def logits_weight(self) -> torch.Tensor:
        """What compute_logits multiplies by (the tied embedding table; this rank's rows)."""
        return self.model.embed_tokens.weight

    def stacked_weight(self, name: str) -> tuple[str, int] | None:
        """A per-expert checkpoint tensor -> (stacked parameter, shard), see MXFP4Experts and FP8Experts; else
        None."""
        match = self.per_expert_tensor.match(name)
        if match is None:
            return None
        prefix, expert, proj, kind = match.groups()
        stacked = "down_proj" if proj == "down" else "gate_up_proj"
        shard = int(expert) if proj == "down" else 2 * int(expert) + (proj == "up")
        return f"{prefix}.{stacked}{self._stacked_suffix[kind]}", shard

    def kv_scale_target(self, name: str) -> tuple[int, str] | None:
        """A checkpoint's KV cache scale -> (layer, "k" or "v"); else None."""
        match = self.kv_scale_tensor.match(name)
        return (int(match.group(1)), match.group(2)) if match else None

    def ignored_weight(self, name: str) -> bool:
        """Checkpoint tensors this model never reads: towers, the tied lm_head, K/V of KV-sharing layers."""
        if name.startswith(self.skipped_prefixes) or name == "lm_head.weight":
            return True
        if name.startswith(("vision.projector.embedding.", "audio.projector.embedding.")):
            return True  # Gemma 3n's token table of the projector, left in some Gemma 4 checkpoints: never read
        parts = name.split(".")
        if len(parts) > 4 and parts[1] == "layers" and parts[3] == "self_attn":
            shares = int(parts[2]) in self.model.share_targets
            return shares and parts[4] in ("k_proj", "v_proj", "k_norm", "v_norm")
        return False

    def dataflow(self):
        return self.model.dataflow()

    def forward(self, ids: torch.Tensor, ctx: ForwardContext,
                mm_embeds: MultiModalEmbeds | None = None) -> torch.Tensor:
        """mm_embeds: soft tokens (embed_images) that replace the embeddings of some of the step's token rows."""
        return self.model(ids, ctx, mm_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.tp.all_gather_last(self._logits_linear(hidden, self.model.embed_tokens.weight))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
