"""Tiny random Gemma 4 checkpoints built with transformers (the reference), with every weight randomized:
norm weights and layer_scalar too, since their default of 1 would hide bugs."""
import json
from pathlib import Path

import torch
from transformers import (Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4AudioConfig, Gemma4Config,
                          Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig)

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
            attention_k_eq_v=True, sliding_window=8, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
            max_position_embeddings=512, bos_token_id=2, eos_token_id=1, pad_token_id=0)

VARIANTS = {
    "dense": {},
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                attention_k_eq_v=True),
    "ple": dict(hidden_size_per_layer_input=16, vocab_size_per_layer_input=96, num_kv_shared_layers=2,
                use_double_wide_mlp=True, attention_k_eq_v=False, num_hidden_layers=7,
                layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 3
                + ["full_attention"]),
}

# Both vision tower shapes, scaled down: 31B/26B-A4B (standardized soft tokens, 72-dim heads) and E2B/E4B (clipped
# linears, 64-dim heads). The small head dims keep the real ones' kind: 2-D RoPE turns head_dim / 4 frequencies per
# axis, 18 for 72 and 6 for 24 (not powers of two), 16 for 64 and 4 for 16.
VISION = {
    "standardized": dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=24, standardize=True),
    "clipped": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=16, use_clipped_linears=True),
}
# The E2B/E4B audio tower scaled down: its attention window (chunk 12, 12 frames back) and the 128 mel bins kept (the
# first convolution's channels equal the bins, as transformers sizes input_proj_linear by them); "wide_window" sees
# frames ahead too, with a chunk shorter than the window.
AUDIO = {
    "real_window": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 4],
                        output_proj_dims=24, conv_kernel_size=5),
    "wide_window": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 4],
                        output_proj_dims=24, conv_kernel_size=3, attention_chunk_size=4, attention_context_left=6,
                        attention_context_right=3),
}
# Special tokens inside the tiny vocabulary (random_prompt draws from 3..95: prompts for these models avoid 89..95)
MULTIMODAL_TOKENS = dict(image_token_id=90, video_token_id=91, boi_token_id=92, eoi_token_id=93, audio_token_id=94,
                         boa_token_id=95, eoa_token_index=89)

# The assistant's own decoder; its attention shapes follow the target's (its layers read the target's KV).
ASSISTANT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, hidden_size_per_layer_input=0,
                 vocab_size_per_layer_input=0, enable_moe_block=False, use_double_wide_mlp=False,
                 num_kv_shared_layers=0, layer_types=["sliding_attention", "sliding_attention", "full_attention"])


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith(("scale", "per_expert_scale")):
                p.copy_(1.0 + 0.5 * torch.rand(p.shape, generator=g) - 0.25)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.6 + 0.8 * torch.rand(b.shape, generator=g))
        _randomize_vision_buffers(model, g)


def _randomize_vision_buffers(model: torch.nn.Module, g: torch.Generator) -> None:
    """The standardization's bias and scale, and clip bounds tight enough that some values clip (unbounded by
    default, which would hide a missing clamp)."""
    for name, b in model.named_buffers():
        if name.endswith("std_bias"):
            b.copy_(torch.randn(b.shape, generator=g))
        elif name.endswith("std_scale"):
            b.copy_(0.5 + torch.rand(b.shape, generator=g))
        elif name.endswith(("input_min", "input_max", "output_min", "output_max")):
            bound = (1.0 if "input" in name else 0.2) * (0.5 + torch.rand((), generator=g))
            b.copy_(-bound if name.endswith("min") else bound)


def text_config(variant: str, **overrides) -> Gemma4TextConfig:
    return Gemma4TextConfig(**{**BASE, **VARIANTS[variant], **overrides})


def multimodal_config(text: Gemma4TextConfig, vision: str | None, audio: str | None = None,
                      tokens: dict = MULTIMODAL_TOKENS) -> Gemma4Config:
    if vision is None and audio is None:
        return Gemma4Config(text_config=text.to_dict())
    towers = {}
    if vision is not None:
        towers["vision_config"] = Gemma4VisionConfig(**VISION[vision]).to_dict()
    if audio is not None:
        towers["audio_config"] = Gemma4AudioConfig(**AUDIO[audio]).to_dict()
    return Gemma4Config(text_config=text.to_dict(), **towers, **tokens)


# The demo's character tokenizer's media tokens (ids 101..107 of its 128), for a tiny model that takes text and
# chats (char_tokenizer=True); its chat template renders audio parts as Gemma 4's does, one <|audio|> each.
CHAR_TOKENS = dict(boi_token_id=101, image_token_id=102, eoi_token_id=103, video_token_id=104, audio_token_id=105,
                   boa_token_id=106, eoa_token_index=107)


def save_char_tokenizer_with_audio(out: Path) -> None:
    from atomlite.demo.tokenizer import build_char_tokenizer
    tokenizer = build_char_tokenizer()
    video_part = "{% elif part['type'] == 'video' %}<|video|>"
    assert video_part in tokenizer.chat_template
    tokenizer.chat_template = tokenizer.chat_template.replace(
        video_part, video_part + "{% elif part['type'] == 'audio' %}<|audio|>")
    tokenizer.save_pretrained(out)


def _rarely_chosen(model: torch.nn.Module, token_ids: list[int]) -> None:
    """Shrinks the (tied) embedding rows of token_ids, so that greedy decoding never picks them: transformers reads a
    media token in the ids as a placeholder, atomlite as the token it is, and the two would part there."""
    with torch.no_grad():
        model.get_input_embeddings().weight[token_ids] *= 0.01


def build(variant: str, out: Path, seed: int = 0, multimodal: bool = False, per_layer_form: bool = True,
          vision: str | None = None, audio: str | None = None, char_tokenizer: bool = False, **overrides):
    """Save a tiny checkpoint to out and return the float32 transformers model (eval mode). vision: a tower shape of
    VISION, audio: one of AUDIO (a Gemma4ForConditionalGeneration with those towers); char_tokenizer: the demo's
    tokenizer saved with it (a 128-token vocabulary, CHAR_TOKENS)."""
    if char_tokenizer:
        overrides = {"vocab_size": 128, "vocab_size_per_layer_input": 128, **overrides}
    cfg = text_config(variant, **overrides)
    torch.manual_seed(seed)
    if multimodal or vision or audio:
        tokens = CHAR_TOKENS if char_tokenizer else MULTIMODAL_TOKENS
        model = Gemma4ForConditionalGeneration(multimodal_config(cfg, vision, audio, tokens))
    else:
        model = Gemma4ForCausalLM(cfg)
    randomize(model, seed)
    if char_tokenizer:
        _rarely_chosen(model, list(CHAR_TOKENS.values()))
    model = model.float().eval()
    model.save_pretrained(out)
    if char_tokenizer:
        save_char_tokenizer_with_audio(out)
    if not per_layer_form:
        _write_hub_form(out, variant, overrides)
    return model


def _write_hub_form(out: Path, variant: str, overrides: dict) -> None:
    """Rewrite config.json the way hub checkpoints serialize it (global_head_dim, no per_layer_config)."""
    path = out / "config.json"
    raw = json.loads(path.read_text())
    text = raw.get("text_config", raw)
    text.pop("per_layer_config", None)
    merged = {**BASE, **VARIANTS[variant], **overrides}
    text["global_head_dim"] = merged["global_head_dim"]
    text["num_global_key_value_heads"] = merged["num_global_key_value_heads"]
    path.write_text(json.dumps(raw, indent=2))


def assistant_config(variant: str, ordered: bool = False, **target_overrides) -> Gemma4AssistantConfig:
    """A tiny assistant for the target text_config(variant, **target_overrides); ordered: centroid logits."""
    target = {**BASE, **VARIANTS[variant], **target_overrides}
    text = Gemma4TextConfig(**{**target, **ASSISTANT})
    return Gemma4AssistantConfig(text_config=text.to_dict(), backbone_hidden_size=target["hidden_size"],
                                 use_ordered_embeddings=ordered, num_centroids=8, centroid_intermediate_top_k=3)


def build_assistant(variant: str, out: Path, seed: int = 0, ordered: bool = False, **target_overrides):
    """Save a tiny random assistant checkpoint for that target to out; return the float32 transformers model."""
    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(assistant_config(variant, ordered, **target_overrides))
    randomize(model, seed)
    if ordered:
        ordering = model.masked_embedding.token_ordering
        ordering.copy_(torch.randperm(ordering.numel(), generator=torch.Generator().manual_seed(seed)))
    model = model.float().eval()
    model.save_pretrained(out)
    return model


# Gemma 3 text (Gemma3ForCausalLM): five sliding layers then a global one, and variants the model was not written
# around: linear RoPE scaling with both soft-caps set, head_dim != hidden / heads with one KV head and a layer_types
# list of its own, and a hub-form config.json (legacy rope_theta / rope_local_base_freq / rope_scaling fields and
# sliding_window_pattern instead of rope_parameters and layer_types).
GEMMA3_BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
                   max_position_embeddings=512, bos_token_id=2, eos_token_id=1, pad_token_id=0)
GEMMA3_VARIANTS = {
    "gemma3": {},
    "gemma3_linear_softcap": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_theta=50_000.0,
                                  rope_local_base_freq=500.0, final_logit_softcapping=5.0,
                                  attn_logit_softcapping=3.0, sliding_window_pattern=3, num_hidden_layers=7),
    "gemma3_wide_heads": dict(head_dim=48, num_key_value_heads=1, query_pre_attn_scalar=48, sliding_window=5,
                              layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                           "full_attention", "sliding_attention"], num_hidden_layers=5),
}
GEMMA3_HUB_FORM = dict(rope_theta=200_000.0, rope_local_base_freq=2_000.0, sliding_window_pattern=2,
                       rope_scaling={"rope_type": "linear", "factor": 8.0}, num_hidden_layers=5)


def gemma3_config(variant: str, **overrides):
    from transformers import Gemma3TextConfig
    return Gemma3TextConfig(**{**GEMMA3_BASE, **GEMMA3_VARIANTS.get(variant, {}), **overrides})


def build_gemma3(variant: str, out: Path, seed: int = 0, hub_form: bool = False, multimodal: bool = False,
                 **overrides):
    """Save a tiny Gemma3ForCausalLM checkpoint to out and return the float32 transformers model (eval mode).
    hub_form: GEMMA3_HUB_FORM's fields, written to config.json as hub checkpoints have them (legacy RoPE fields,
    sliding_window_pattern). multimodal: a Gemma3ForConditionalGeneration with a tiny SigLIP tower, its text_config
    left as sparse as the hub's (fields at transformers' defaults left out)."""
    from transformers import Gemma3ForCausalLM
    if hub_form:
        overrides = {**GEMMA3_HUB_FORM, **overrides}
    torch.manual_seed(seed)
    config = gemma3_config(variant, **overrides)
    model = _gemma3_multimodal(config) if multimodal else Gemma3ForCausalLM(config)
    randomize(model, seed)
    model = model.float().eval()
    model.save_pretrained(out)
    if hub_form:
        _write_gemma3_hub_form(out, {**GEMMA3_BASE, **GEMMA3_VARIANTS.get(variant, {}), **overrides})
    if multimodal:
        _drop_gemma3_text_defaults(out)
    return model


def _gemma3_multimodal(text):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    return Gemma3ForConditionalGeneration(Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                                       mm_tokens_per_image=4, image_token_index=95,
                                                       boi_token_index=93, eoi_token_index=94))


def _write_gemma3_hub_form(out: Path, fields: dict) -> None:
    path = out / "config.json"
    raw = json.loads(path.read_text())
    for key in ("rope_parameters", "layer_types"):
        raw.pop(key, None)
    raw.update({key: fields[key] for key in ("rope_theta", "rope_local_base_freq", "sliding_window_pattern",
                                             "rope_scaling")})
    path.write_text(json.dumps(raw, indent=2))


def _drop_gemma3_text_defaults(out: Path) -> None:
    from transformers import Gemma3TextConfig
    defaults = Gemma3TextConfig().to_dict()
    path = out / "config.json"
    raw = json.loads(path.read_text())
    text = raw["text_config"]
    raw["text_config"] = {k: v for k, v in text.items() if k == "model_type" or defaults.get(k, object()) != v}
    path.write_text(json.dumps(raw, indent=2))
