"""What Gemma 4 reads from a checkpoint's config.json: each layer's attention (sliding or full, head dims, KV heads,
k_eq_v), RoPE per layer kind, and the vision and audio towers with the special tokens that place images and clips in
a prompt."""
from atomlite.config import AudioSpec, LayerAttention, ModelLayout, VisionSpec, text_config

MULTIMODAL_MODEL_TYPES = {"gemma4"}
# Gemma 4's special token ids, where a multimodal config.json leaves them out (transformers' Gemma4Config defaults)
DEFAULT_MULTIMODAL_TOKENS = {"image_token_id": 258_880, "video_token_id": 258_884, "boi_token_id": 255_999,
                             "eoi_token_id": 258_882}
DEFAULT_AUDIO_TOKENS = {"audio_token_id": 258_881, "boa_token_id": 256_000, "eoa_token_index": 258_883}
# Gemma 4's RoPE per layer kind when the config's rope_parameters leave it out
DEFAULT_ROPE = {"sliding": {"rope_type": "default", "rope_theta": 10_000.0},
                "full": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


def layer_attention(text: dict) -> list[LayerAttention]:
    num_layers = text["num_hidden_layers"]
    layer_types = text.get("layer_types") or [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(num_layers)]
    k_eq_v = bool(text.get("attention_k_eq_v", False))
    overrides = {int(k): v for k, v in (text.get("per_layer_config") or {}).items()}
    layers = []
    for i, layer_type in enumerate(layer_types):
        full = layer_type == "full_attention"
        head_dim, kv_heads = text.get("head_dim", 256), text["num_key_value_heads"]
        if full and "per_layer_config" not in text:
            head_dim = text.get("global_head_dim", 512)
            if k_eq_v and text.get("num_global_key_value_heads"):
                kv_heads = text["num_global_key_value_heads"]
        override = overrides.get(i, {})
        layers.append(LayerAttention(
            kind="full" if full else "sliding",
            head_dim=override.get("head_dim", head_dim),
            num_kv_heads=override.get("num_key_value_heads", kv_heads),
            k_eq_v=k_eq_v and full))
    return layers


def rope_by_kind(text: dict) -> dict[str, dict]:
    given = text.get("rope_parameters") or {}
    return {kind: given.get(f"{kind}_attention") or default for kind, default in DEFAULT_ROPE.items()}


def vision_spec(raw: dict, text: dict) -> VisionSpec | None:
    """The vision part of a multimodal config.json; None where it has no vision_config."""
    if not raw.get("vision_config"):
        return None
    tokens = {key: raw.get(key, default) for key, default in DEFAULT_MULTIMODAL_TOKENS.items()}
    pad = text.get("pad_token_id")
    return VisionSpec(dict(raw["vision_config"]), **tokens,
                      use_bidirectional_attention=text.get("use_bidirectional_attention"),
                      pad_token_id=0 if pad is None else pad)


def audio_spec(raw: dict, text: dict) -> AudioSpec | None:
    """The audio part of a multimodal config.json (E2B/E4B); None where it has no audio_config."""
    if not raw.get("audio_config"):
        return None
    tokens = {key: raw.get(key, default) for key, default in DEFAULT_AUDIO_TOKENS.items()}
    pad = text.get("pad_token_id")
    return AudioSpec(dict(raw["audio_config"]), tokens["audio_token_id"], tokens["boa_token_id"],
                     tokens["eoa_token_index"], 0 if pad is None else pad)


def layout(text: dict) -> ModelLayout:
    """A Gemma 4 text config alone (the assistant's decoder, or a text checkpoint)."""
    return ModelLayout(text, layer_attention(text), rope_by_kind(text))


def parse_config(raw: dict) -> ModelLayout:
    """A Gemma4ForCausalLM or Gemma4ForConditionalGeneration config.json."""
    multimodal = raw.get("model_type") in MULTIMODAL_MODEL_TYPES or "text_config" in raw
    text = text_config(raw) if multimodal else raw
    text_only = layout(text)
    return ModelLayout(text, text_only.layers, text_only.rope, multimodal,
                       vision_spec(raw, text) if multimodal else None, audio_spec(raw, text) if multimodal else None)
