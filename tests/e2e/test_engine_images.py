"""The engine serves images: greedy tokens and log-probs of prompts with 0, 1 and 2 images equal transformers'
Gemma4ForConditionalGeneration's (float32, tiny random models of both tower shapes, causal and bidirectional image
attention, PLE), at every max_soft_tokens; an image is encoded once (encoder cache) and never split across prefill
chunks; mixed batches, the encoder budget and refusals. Prefix caching and preemption with images:
test_engine_images_cache.py."""
import pytest
import torch

from atomlite import LLM
from image_prompts import (assert_matches, engine_greedy, greedy, image_prompt, items_of, transformers_greedy,
                           video_prompt, vision_checkpoint)

ENGINE = dict(dtype="float32", device="cpu")


def engine_for(checkpoints, variant, shape, bidirectional, **args):
    path, ref = vision_checkpoint(checkpoints, variant, shape, bidirectional)
    return LLM(str(path), **ENGINE, **args).engine, ref


CASES = [  # (variant, tower shape, bidirectional image attention, image aspects)
    ("dense", "standardized", True, ["landscape"]),
    ("dense", "standardized", False, ["landscape", "tall"]),
    ("dense", "clipped", True, []),
    ("ple", "clipped", False, ["tall"]),
    ("ple", "clipped", True, ["landscape", "tall"]),
    ("moe", "standardized", True, ["tall", "landscape"]),
]


@pytest.mark.parametrize("variant,shape,bidirectional,aspects", CASES)
def test_greedy_tokens_and_logprobs_match_transformers(checkpoints, variant, shape, bidirectional, aspects):
    engine, ref = engine_for(checkpoints, variant, shape, bidirectional, enable_prefix_caching=False)
    assert engine.model.image_spans_bidirectional == bidirectional
    prompt = image_prompt(items_of(aspects))
    got = engine_greedy(engine, {"r": prompt}, 4)["r"]
    assert_matches(got, transformers_greedy(ref, prompt, 4))
    assert engine.runner.images.num_encoded == len(aspects)


@pytest.mark.parametrize("variant,shape,bidirectional", [("ple", "clipped", True), ("dense", "standardized", False)])
def test_video_frames_match_transformers(checkpoints, variant, shape, bidirectional):
    """A video's frames: each its own block of video soft tokens (mm_token_type_ids 2 in transformers)."""
    engine, ref = engine_for(checkpoints, variant, shape, bidirectional, enable_prefix_caching=False)
    prompt = video_prompt(3)
    assert len(prompt.items) == 3 and all(item.modality == "video" for item in prompt.items)
    assert_matches(engine_greedy(engine, {"r": prompt}, 4)["r"], transformers_greedy(ref, prompt, 4))
    assert engine.runner.images.num_encoded == 3


@pytest.mark.parametrize("max_soft_tokens", [70, 140, 280, 560, 1120])
def test_every_max_soft_tokens_matches_transformers(checkpoints, max_soft_tokens):
    """The tiny source images are upscaled to the budget: 1120 is ~10000 patches through the tiny tower."""
    engine, ref = engine_for(checkpoints, "dense", "standardized", True, enable_prefix_caching=False)
    prompt = image_prompt(items_of(["tall"], max_soft_tokens))
    assert max_soft_tokens // 2 < prompt.items[0].num_soft_tokens <= max_soft_tokens
    assert_matches(engine_greedy(engine, {"r": prompt}, 3)["r"], transformers_greedy(ref, prompt, 3))


def test_an_image_that_would_cross_a_chunk_boundary_starts_the_next_chunk(checkpoints):
    engine, ref = engine_for(checkpoints, "ple", "clipped", True, enable_prefix_caching=False,
                             max_num_batched_tokens=80)
    prompt = image_prompt(items_of(["landscape"]), text=list(range(3, 43)))  # image rows 41..103: past 80
    chunks = []
    run = engine.runner.execute
    engine.runner.execute = lambda batch: chunks.append([n for _, n in batch]) or run(batch)
    got = engine_greedy(engine, {"r": prompt}, 3)["r"]
    offset, length = prompt.placeholder_ranges[0]
    assert offset < 80 < offset + length  # one chunk of 80 would have split it
    assert chunks[:2] == [[offset], [len(prompt.prompt_token_ids) - offset]]
    assert_matches(got, transformers_greedy(ref, prompt, 3))


def test_an_image_larger_than_the_step_budget_is_refused_naming_the_flag(checkpoints):
    engine, _ = engine_for(checkpoints, "dense", "clipped", False, max_num_batched_tokens=32)
    prompt = image_prompt(items_of(["tall"]))
    with pytest.raises(ValueError, match="more than --max-num-batched-tokens 32"):
        engine.add_request("r", prompt.prompt_token_ids, greedy(2), multimodal=prompt)
    assert not engine.has_unfinished() and not engine.requests


def test_a_batch_mixing_text_and_image_requests_matches_transformers(checkpoints):
    engine, ref = engine_for(checkpoints, "dense", "standardized", True, enable_prefix_caching=False)
    prompts = {"text": [5, 9, 13, 21, 8], "one": image_prompt(items_of(["tall"], seed=3)),
               "two": image_prompt(items_of(["landscape", "tall"], seed=5), text=[9, 4])}
    got = engine_greedy(engine, prompts, 4)
    for name, prompt in prompts.items():
        want = transformers_greedy(ref, image_prompt([], text=prompt) if name == "text" else prompt, 4)
        assert_matches(got[name], want)


def test_the_same_image_in_a_later_request_comes_from_the_encoder_cache(checkpoints):
    engine, ref = engine_for(checkpoints, "ple", "clipped", False, enable_prefix_caching=False)
    image = items_of(["landscape"], seed=11)
    calls = []
    embed = engine.model.embed_images
    engine.model.embed_images = lambda pixels, positions: calls.append(len(pixels)) or embed(pixels, positions)
    first, second = image_prompt(image, text=[5, 6]), image_prompt(image, text=[9, 10, 12])
    assert_matches(engine_greedy(engine, {"a": first}, 2)["a"], transformers_greedy(ref, first, 2))
    assert_matches(engine_greedy(engine, {"b": second}, 2)["b"], transformers_greedy(ref, second, 2))
    assert calls == [1] and engine.runner.images.num_encoded == 1 and len(engine.runner.images.cache) == 1


def test_a_steps_uncached_images_are_encoded_in_one_call_within_the_encoder_budget(checkpoints):
    engine, ref = engine_for(checkpoints, "dense", "clipped", True, enable_prefix_caching=False,
                             max_num_encoder_input_tokens=70)
    calls = []
    embed = engine.model.embed_images
    engine.model.embed_images = lambda pixels, positions: calls.append(len(pixels)) or embed(pixels, positions)
    prompts = {"a": image_prompt(items_of(["tall"], seed=1)), "b": image_prompt(items_of(["landscape"], seed=2)),
               "c": image_prompt(items_of(["tall"], seed=1), text=[8, 8])}  # a's image again: no encoder tokens
    got = engine_greedy(engine, prompts, 2)
    assert calls == [1, 1]  # b's image waited for the next step's budget; a's was c's too
    for name, prompt in prompts.items():
        assert_matches(got[name], transformers_greedy(ref, prompt, 2))


def test_key_ends_are_set_only_on_steps_with_soft_tokens_of_a_bidirectional_model(checkpoints):
    seen = {}
    for bidirectional in (True, False):
        engine, _ = engine_for(checkpoints, "dense", "clipped", bidirectional, enable_prefix_caching=False)
        build = engine.runner.inputs.build
        key_ends = seen.setdefault(bidirectional, [])
        engine.runner.inputs.build = lambda batch, **kw: key_ends.append(build(batch, **kw).key_ends) or \
            build(batch, **kw)
        prompt = image_prompt(items_of(["tall"]))
        engine_greedy(engine, {"r": prompt, "t": [5, 6, 7]}, 3)
    prefill, *decodes = seen[True]
    offset, length = prompt.placeholder_ranges[0]
    expected = list(range(1, len(prompt.prompt_token_ids) + 1)) + [1, 2, 3]  # then the text request
    expected[offset:offset + length] = [offset + length] * length
    assert prefill.tolist() == expected and all(k is None for k in decodes)
    assert all(k is None for k in seen[False])


def test_images_for_a_model_without_a_tower_are_refused_naming_it(checkpoints):
    path, _ = checkpoints.get("dense")
    engine = LLM(str(path), **ENGINE).engine
    prompt = image_prompt(items_of(["tall"]))
    with pytest.raises(ValueError, match=f"the model {path} has no vision tower"):
        engine.add_request("r", prompt.prompt_token_ids, greedy(2), multimodal=prompt)


@pytest.mark.parametrize("change,needle", [
    ("length", r"placeholder_ranges\[0\] has 10 tokens; items\[0\] has"),
    ("missing", "1 items but 0 placeholder_ranges"),
    ("tokens", "covers tokens that are not image placeholders"),
])
def test_a_multimodal_prompt_that_does_not_add_up_is_an_error_naming_the_field(checkpoints, change, needle):
    engine, _ = engine_for(checkpoints, "dense", "clipped", False)
    prompt = image_prompt(items_of(["tall"]))
    if change == "length":
        prompt.placeholder_ranges = [(prompt.placeholder_ranges[0][0], 10)]
    elif change == "missing":
        prompt.placeholder_ranges = []
    else:
        offset = prompt.placeholder_ranges[0][0]
        prompt.prompt_token_ids[offset + 3] = 7
    with pytest.raises(ValueError, match=needle):
        engine.add_request("r", prompt.prompt_token_ids, greedy(2), multimodal=prompt)
    assert not engine.requests


def test_a_finished_request_keeps_no_pixels(checkpoints):
    engine, _ = engine_for(checkpoints, "dense", "clipped", False, encoder_cache_memory=1)
    prompt = image_prompt(items_of(["tall"]))
    seq = engine.add_request("r", prompt.prompt_token_ids, greedy(2), multimodal=prompt)
    while engine.has_unfinished():
        engine.step()
    assert seq.images == [] and len(engine.runner.images.cache) == 0  # one byte holds no soft tokens
    assert torch.is_tensor(prompt.items[0].pixel_values)


def test_limits_of_zero_images_and_video_serve_the_text_model_without_its_tower(checkpoints):
    """vLLM's text-only mode of a multimodal checkpoint: the tower is neither built nor loaded; text is unchanged."""
    with_tower, _ = engine_for(checkpoints, "dense", "clipped", False)
    text_only, _ = engine_for(checkpoints, "dense", "clipped", False, limit_mm_per_prompt={"image": 0, "video": 0})
    assert text_only.model.vision is None and text_only.model.vision_spec is None
    assert not any(name.startswith("vision.") for name, _ in text_only.model.named_parameters())
    prompt = list(range(3, 40))
    assert engine_greedy(text_only, {"r": prompt}, 5) == engine_greedy(with_tower, {"r": prompt}, 5)
    images_only, _ = engine_for(checkpoints, "dense", "clipped", False, limit_mm_per_prompt={"video": 0})
    assert images_only.model.vision is not None
