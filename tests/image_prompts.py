"""Prompts with images for the tiny vision checkpoints (tiny_models.build(vision=...)), the engine's greedy tokens and
log-probs for them, and transformers' Gemma4ForConditionalGeneration's, the reference: float32 logits of a full
forward per token, its own tower's soft tokens computed once and given back (mm_encoder_outputs)."""
import numpy as np
import torch
from PIL import Image
from transformers.modeling_outputs import BaseModelOutputWithPooling

import tiny_models
from atomlite import SamplingParams
from atomlite.multimodal.inputs import ImageItem, MultiModalPrompt, placeholder_runs
from atomlite.multimodal.items import image_item, video_frame_items
from atomlite.multimodal.patches import PatchSpec
from atomlite.multimodal.video import sampled_video

TOKENS = tiny_models.MULTIMODAL_TOKENS
IMAGE, BOI, EOI = TOKENS["image_token_id"], TOKENS["boi_token_id"], TOKENS["eoi_token_id"]
VIDEO = TOKENS["video_token_id"]
ASPECTS = {"landscape": (64, 48), "tall": (30, 90)}  # (width, height) of the source image
# one build per (variant, tower, attention) shared by the test files: room for a 1120-token image in the context
CONTEXT = dict(max_position_embeddings=2048)


def vision_checkpoint(checkpoints, variant: str, shape: str, bidirectional: bool):
    """(folder, transformers model) of a tiny vision checkpoint; bidirectional: use_bidirectional_attention
    "vision" (an image's tokens see each other both ways on sliding layers), else causal."""
    mode = {"use_bidirectional_attention": "vision"} if bidirectional else {}
    return checkpoints.get(variant, vision=shape, **CONTEXT, **mode)


def random_image(aspect: str, seed: int = 0) -> Image.Image:
    width, height = ASPECTS[aspect]
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def items_of(aspects: list[str], max_soft_tokens: int = 70, seed: int = 0) -> list[ImageItem]:
    spec = PatchSpec(max_soft_tokens=max_soft_tokens)
    return [image_item(random_image(aspect, seed + i), spec, f"image {i}") for i, aspect in enumerate(aspects)]


def image_prompt(items: list[ImageItem], text: list[int] = (5, 17, 33, 8), between: list[int] = (7, 11)) \
        -> MultiModalPrompt:
    """text, then each item as boi, its placeholders, eoi and `between`."""
    ids = list(text)
    for item in items:
        ids += [BOI] + [IMAGE] * item.num_soft_tokens + [EOI] + list(between)
    return MultiModalPrompt(ids, list(items), placeholder_runs(ids, {IMAGE}))


@torch.no_grad()
def transformers_greedy(ref, prompt: MultiModalPrompt, max_tokens: int, image_token_id: int = IMAGE) \
        -> tuple[list[int], list[float]]:
    """Greedy tokens and each one's log-prob, a full forward per token."""
    given = {}
    if prompt.items:
        pixels = torch.stack([item.pixel_values for item in prompt.items])
        positions = torch.stack([item.image_position_ids for item in prompt.items])
        if prompt.items[0].modality == "video":  # one video: its frames
            frames = torch.tensor([len(prompt.items)])
            soft = ref.model.get_video_features(pixels, positions, num_frames_per_video=frames).pooler_output
            given = {"mm_encoder_outputs": {"video": BaseModelOutputWithPooling(pooler_output=tuple(soft))}}
        else:
            soft = ref.model.get_image_features(pixels, positions).pooler_output
            given = {"mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=tuple(soft))}}
    return reference_greedy(ref, prompt.prompt_token_ids, {image_token_id: 1, VIDEO: 2}, given, max_tokens)


def reference_greedy(ref, prompt_ids: list[int], token_types: dict[int, int], given: dict, max_tokens: int,
                     refused: tuple[int, ...] = ()) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and each one's log-prob, a full forward per token; token_types: each media
    token's mm_token_type_ids value (other tokens 0); given: the media arguments of every forward. A token in
    refused fails the test: transformers would read it as a placeholder, atomlite as the token."""
    ids, tokens, logprobs = list(prompt_ids), [], []
    for _ in range(max_tokens):
        types = torch.tensor([[token_types.get(t, 0) for t in ids]])
        logits = ref(input_ids=torch.tensor([ids]), mm_token_type_ids=types, **given).logits[0, -1]
        row = torch.log_softmax(logits.float(), dim=-1)
        token = int(row.argmax())
        assert token not in refused, f"the tiny model chose media token {token}: pick another prompt or seed"
        tokens.append(token)
        logprobs.append(float(row[token]))
        ids.append(token)
    return tokens, logprobs


def video_prompt(num_frames: int, seed: int = 0) -> MultiModalPrompt:
    """One video of num_frames random 40x56 frames, each frame as the processor lays it out (its timestamp's text,
    here two tokens; boi, its placeholders, eoi)."""
    frames = np.random.default_rng(seed).integers(0, 256, (num_frames, 40, 56, 3), dtype=np.uint8)
    items = video_frame_items(sampled_video(frames, "video"), PatchSpec(max_soft_tokens=70))
    ids = [5, 17]
    for item in items:
        ids += [9, 10, BOI] + [VIDEO] * item.num_soft_tokens + [EOI]
    return MultiModalPrompt(ids + [33, 8], items, placeholder_runs(ids, {VIDEO}))


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=0)


def engine_greedy(engine, prompts: dict[str, MultiModalPrompt | list[int]], max_tokens: int) \
        -> dict[str, tuple[list[int], list[float]]]:
    """Every prompt added at once, stepped until all finish: request id -> (tokens, each one's log-prob)."""
    seqs = {}
    for request_id, prompt in prompts.items():
        if isinstance(prompt, MultiModalPrompt):
            seqs[request_id] = engine.add_request(request_id, prompt.prompt_token_ids, greedy(max_tokens),
                                                  multimodal=prompt)
        else:
            seqs[request_id] = engine.add_request(request_id, list(prompt), greedy(max_tokens))
    while engine.has_unfinished():
        engine.step()
    return {request_id: (seq.output_token_ids, [lp[t] for lp, t in zip(seq.logprobs, seq.output_token_ids)])
            for request_id, seq in seqs.items()}


def assert_matches(got: tuple[list[int], list[float]], want: tuple[list[int], list[float]], atol: float = 1e-3):
    assert got[0] == want[0], (got, want)
    np.testing.assert_allclose(got[1], want[1], atol=atol, rtol=0)
