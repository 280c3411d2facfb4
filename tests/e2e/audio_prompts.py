"""Prompts with audio clips (and images) for tiny E-style checkpoints with an audio tower and the demo's character
tokenizer (tiny_models.build(audio=..., char_tokenizer=True)), and transformers' Gemma4ForConditionalGeneration's
greedy tokens and log-probs for them, the reference: float32 logits of a full forward per token, the clips as the
feature extractor pads them in one batch, the images' soft tokens computed by its own tower and given back."""
import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

import tiny_models
from image_prompts import reference_greedy
from atomlite.multimodal.inputs import MultiModalPrompt

TOKENS = tiny_models.CHAR_TOKENS
AUDIO, IMAGE = TOKENS["audio_token_id"], TOKENS["image_token_id"]
TEXT = [2, 40, 51, 62, 73]  # <bos> and four characters
CONTEXT = dict(max_position_embeddings=2048)


def audio_checkpoint(checkpoints, variant: str = "ple", audio: str = "real_window", vision: str | None = "clipped"):
    """(folder, transformers model): an E-style (PLE, KV sharing) tiny model with an audio and a vision tower."""
    return checkpoints.get(variant, audio=audio, vision=vision, char_tokenizer=True, **CONTEXT)


def clip(seconds: float, seed: int = 0, rate: int = 16_000) -> tuple[np.ndarray, int]:
    """(samples, sample_rate): a tone under noise."""
    t = np.arange(int(rate * seconds)) / rate
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * noise).astype(np.float32), rate


def prompt_ids(modalities: list[str], text: list[int] = TEXT, between: list[int] = (44, 55)) -> list[int]:
    """text, then one placeholder per item, each followed by `between`."""
    ids = list(text)
    for modality in modalities:
        ids += [AUDIO if modality == "audio" else IMAGE] + list(between)
    return ids


def padded_features(prompt: MultiModalPrompt) -> dict:
    """The prompt's clips as the feature extractor batches them: features padded to the longest, and the mask."""
    clips = [item.input_features for item in prompt.items if item.modality == "audio"]
    if not clips:
        return {}
    frames = max(len(c) for c in clips)
    features = torch.zeros(len(clips), frames, clips[0].shape[1])
    mask = torch.zeros(len(clips), frames, dtype=torch.bool)
    for i, c in enumerate(clips):
        features[i, :len(c)], mask[i, :len(c)] = c, True
    return {"input_features": features, "input_features_mask": mask}


@torch.no_grad()
def transformers_greedy(ref, prompt: MultiModalPrompt, max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and each one's log-prob, a full forward per token."""
    given = padded_features(prompt)
    images = [item for item in prompt.items if item.modality == "image"]
    if images:
        pixels = torch.stack([item.pixel_values for item in images])
        positions = torch.stack([item.image_position_ids for item in images])
        soft = ref.model.get_image_features(pixels, positions).pooler_output
        given["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=tuple(soft))}
    return reference_greedy(ref, prompt.prompt_token_ids, {IMAGE: 1, AUDIO: 3}, given, max_tokens,
                            refused=tuple(TOKENS.values()))
