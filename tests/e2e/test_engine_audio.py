"""The engine hears: LLM.generate with multi_modal_data {"audio": (samples, sample_rate)} (one clip, a list, a clip
with an image, requests with clips of two lengths in one batch) gives transformers' Gemma4ForConditionalGeneration's
greedy tokens and log-probs (float32, tiny E-style models: PLE and KV sharing, with audio and vision towers); a clip
is encoded once (encoder cache), never split across prefill chunks, keys the prefix cache by its content; refusals
name the field or the model."""
import numpy as np
import pytest

from atomlite import LLM, SamplingParams
from atomlite.multimodal.inputs import MultiModalPrompt
from audio_prompts import TEXT, audio_checkpoint, clip, prompt_ids, transformers_greedy
from image_prompts import assert_matches, random_image

ENGINE = dict(dtype="float32", device="cpu")


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=0)


def llm_for(checkpoints, audio: str = "real_window", **args) -> tuple[LLM, object]:
    path, ref = audio_checkpoint(checkpoints, audio=audio)
    return LLM(str(path), **ENGINE, **args), ref


def tokens_and_logprobs(output) -> tuple[list[int], list[float]]:
    completion = output.outputs[0]
    return completion.token_ids, [float(lp[t]) for lp, t in zip(completion.logprobs, completion.token_ids)]


def run(llm: LLM, prompts: list[dict], max_tokens: int = 4):
    """(atomlite's outputs, the processed prompts transformers reads)."""
    processed = [llm._multimodal.prompt_dict(p)[1] for p in prompts]
    return llm.generate(prompts, greedy(max_tokens)), processed


@pytest.mark.parametrize("audio", ["real_window", "wide_window"])
def test_one_clip_matches_transformers(checkpoints, audio):
    llm, ref = llm_for(checkpoints, audio, enable_prefix_caching=False)
    prompt = {"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": clip(0.9)}}
    (out,), (processed,) = run(llm, [prompt])
    assert processed.items[0].num_soft_tokens == 23  # 90 ms per 10 ms frame: 89 frames, a token per 4
    assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 4))
    assert llm.engine.runner.images.num_encoded == 1


def test_two_clips_in_one_prompt_match_transformers(checkpoints):
    llm, ref = llm_for(checkpoints, enable_prefix_caching=False)
    prompt = {"prompt_token_ids": prompt_ids(["audio", "audio"]),
              "multi_modal_data": {"audio": [clip(0.5, seed=1), clip(1.2, seed=2)]}}
    (out,), (processed,) = run(llm, [prompt])
    assert [item.num_soft_tokens for item in processed.items] == [13, 30]
    assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 4))


def test_a_clip_beside_an_image_matches_transformers(checkpoints):
    llm, ref = llm_for(checkpoints, enable_prefix_caching=False)
    prompt = {"prompt_token_ids": prompt_ids(["image", "audio"]),
              "multi_modal_data": {"image": random_image("tall"), "audio": clip(0.7, seed=3)}}
    (out,), (processed,) = run(llm, [prompt])
    assert [item.modality for item in processed.items] == ["image", "audio"]
    assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 4))


def test_requests_with_clips_of_two_lengths_batch_and_match_transformers(checkpoints):
    llm, ref = llm_for(checkpoints, enable_prefix_caching=False)
    calls = []
    embed = llm.engine.model.embed_audio
    llm.engine.model.embed_audio = lambda features: calls.append([len(f) for f in features]) or embed(features)
    prompts = [{"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": clip(1.3, seed=8)}},
               {"prompt_token_ids": prompt_ids(["audio"], text=TEXT[:3]),
                "multi_modal_data": {"audio": clip(0.7, seed=11)}},
               {"prompt_token_ids": [2, 70, 80, 90]}]
    outs, processed = run(llm, prompts)
    assert calls == [[129, 69]]  # both clips in the first step, padded into one tower call
    processed[2] = MultiModalPrompt(prompts[2]["prompt_token_ids"])
    for out, prompt in zip(outs, processed):
        assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, prompt, 4))


def test_a_clip_sampled_at_another_rate_is_resampled_to_16_khz(checkpoints):
    llm, ref = llm_for(checkpoints, enable_prefix_caching=False)
    samples, _ = clip(1.0, rate=24_000)
    prompt = {"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": (samples, 24_000)}}
    (out,), (processed,) = run(llm, [prompt], 3)
    assert processed.items[0].num_soft_tokens == 25  # one second at 16 kHz: 99 frames
    assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 3))


def test_the_same_clip_in_a_later_request_comes_from_the_encoder_cache(checkpoints):
    llm, ref = llm_for(checkpoints, enable_prefix_caching=False)
    same = clip(0.8, seed=6)
    first = {"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": same}}
    second = {"prompt_token_ids": prompt_ids(["audio"], text=TEXT[:2]), "multi_modal_data": {"audio": same}}
    other = {"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": clip(0.8, seed=7)}}
    for prompt, encoded in ((first, 1), (second, 1), (other, 2)):
        (out,), (processed,) = run(llm, [prompt], 2)
        assert llm.engine.runner.images.num_encoded == encoded
        assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 2))


def test_a_prefix_cache_hit_needs_the_same_clip(checkpoints):
    """Blocks under a clip are keyed by its content: the same clip hits, another clip with the same placeholder
    ids does not (it would serve the first clip's KV)."""
    llm, ref = llm_for(checkpoints, block_size=4)
    text = TEXT + [44] * 8
    same = clip(0.6, seed=8)
    first = {"prompt_token_ids": prompt_ids(["audio"], text=text), "multi_modal_data": {"audio": same}}
    again = {"prompt_token_ids": prompt_ids(["audio"], text=text, between=[44, 55, 66]),
             "multi_modal_data": {"audio": same}}
    other = {"prompt_token_ids": prompt_ids(["audio"], text=text, between=[44, 55, 66]),
             "multi_modal_data": {"audio": clip(0.6, seed=9)}}
    run(llm, [first], 1)
    cached = []
    for prompt in (again, other):
        (out,), (processed,) = run(llm, [prompt], 3)
        cached.append(out.num_cached_tokens)
        assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 3))
    offset, length = processed.placeholder_ranges[0]
    assert cached[0] >= offset + length  # past the clip
    assert cached[1] == offset // 4 * 4  # up to the block where the clip starts


def test_a_clip_that_would_cross_a_chunk_boundary_starts_the_next_chunk(checkpoints):
    llm, ref = llm_for(checkpoints, enable_prefix_caching=False, max_num_batched_tokens=40)
    prompt = {"prompt_token_ids": prompt_ids(["audio"], text=TEXT * 5), "multi_modal_data": {"audio": clip(1.0)}}
    chunks = []
    execute = llm.engine.runner.execute
    llm.engine.runner.execute = lambda batch: chunks.append([n for _, n in batch]) or execute(batch)
    (out,), (processed,) = run(llm, [prompt], 3)
    offset, length = processed.placeholder_ranges[0]
    assert offset < 40 < offset + length
    assert chunks[:2] == [[offset], [len(processed.prompt_token_ids) - offset]]
    assert_matches(tokens_and_logprobs(out), transformers_greedy(ref, processed, 3))


@pytest.mark.parametrize("audio,needle", [
    ((np.zeros(16_000 * 31, np.float32), 16_000), r"multi_modal_data.audio\[0\]: the clip lasts over 30 s, the "
                                                 r"limit per clip"),
    ((np.zeros(100, np.float32), 0), r"multi_modal_data.audio\[0\]: sample_rate must be a positive integer"),
    (np.zeros(100, np.float32), r"multi_modal_data.audio\[0\]: give a clip as \(samples, sample_rate\)"),
    ((np.array([np.nan] * 800, np.float32), 16_000), r"multi_modal_data.audio\[0\]: the clip has samples that are "
                                                     r"not finite"),
])
def test_bad_clips_are_refused_naming_the_field(checkpoints, audio, needle):
    llm, _ = llm_for(checkpoints)
    with pytest.raises(ValueError, match=needle):
        llm.generate({"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": audio}}, greedy(1))


def test_audio_for_a_model_without_an_audio_tower_is_refused_naming_it(checkpoints):
    path, _ = checkpoints.get("ple", vision="clipped", char_tokenizer=True)
    llm = LLM(str(path), **ENGINE)
    with pytest.raises(ValueError, match=f"multi_modal_data.audio: the model {path.name} has no audio tower"):
        llm.generate({"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": clip(0.5)}},
                     greedy(1))


def test_a_limit_of_zero_clips_serves_the_model_without_its_audio_tower(checkpoints):
    llm, _ = llm_for(checkpoints, limit_mm_per_prompt={"audio": 0})
    assert llm.engine.model.audio is None and llm.engine.model.vision is not None
    with pytest.raises(ValueError, match="the prompt has 1 audios, over the limit of 0"):
        llm.generate({"prompt_token_ids": prompt_ids(["audio"]), "multi_modal_data": {"audio": clip(0.5)}},
                     greedy(1))
