"""Images and the KV cache: a prefix hit with the same image reaches past it, another image of the same size (the same
placeholder ids) misses from the image on, a hit never ends inside an image; preemption recomputes image prompts
to transformers' tokens; two tensor-parallel ranks (gloo) place the same soft tokens."""
import pytest

from atomlite import LLM
from atomlite.engine.images.seq_images import SeqItem, block_image_marks, placed_images
from image_prompts import (assert_matches, engine_greedy, greedy, image_prompt, items_of, transformers_greedy,
                           vision_checkpoint)

ENGINE = dict(dtype="float32", device="cpu", block_size=4)


def test_a_prefix_hit_needs_the_same_image(checkpoints):
    path, ref = vision_checkpoint(checkpoints, "dense", "standardized", True)
    engine = LLM(str(path), **ENGINE).engine
    image, other = items_of(["tall"], seed=1), items_of(["tall"], seed=2)
    first = image_prompt(image, between=list(range(3, 30)))
    offset, length = first.placeholder_ranges[0]
    engine_greedy(engine, {"first": first}, 2)
    prompts = {"same": image_prompt(image, between=list(range(3, 30))),
               "other": image_prompt(other, between=list(range(3, 30)))}
    assert prompts["other"].prompt_token_ids == first.prompt_token_ids
    seqs = {}
    for name, prompt in prompts.items():
        seqs[name] = engine.add_request(name, prompt.prompt_token_ids, greedy_params(), multimodal=prompt)
        while engine.has_unfinished():
            engine.step()
        assert_matches(output(seqs[name]), transformers_greedy(ref, prompt, 2))
    assert seqs["same"].num_cached_tokens > offset + length
    assert seqs["other"].num_cached_tokens == offset // 4 * 4  # the blocks before the image


def test_a_prefix_hit_never_ends_inside_an_image(checkpoints):
    path, ref = vision_checkpoint(checkpoints, "ple", "clipped", True)
    engine = LLM(str(path), **ENGINE).engine
    image = items_of(["landscape"], seed=4)
    text = [5, 17, 33, 8, 9]
    first, second = image_prompt(image, text, [7, 11, 12]), image_prompt(image, text, [8, 11, 12])
    offset, length = first.placeholder_ranges[0]
    end = offset + length
    assert (end - 1) // 4 == (end + 1) // 4  # the first token that differs shares a block with the image's last
    engine_greedy(engine, {"first": first}, 1)
    seq = engine.add_request("second", second.prompt_token_ids, greedy_params(), multimodal=second)
    while engine.has_unfinished():
        engine.step()
    assert seq.num_cached_tokens == offset // 4 * 4
    assert_matches(output(seq), transformers_greedy(ref, second, 2))


def test_image_blocks_are_keyed_by_the_image_and_where_they_start_in_it():
    image = items_of(["tall"], seed=1)
    placed = placed_images(image_prompt(image), {"image": 90, "video": 91}, 2048, 2048)
    other = [SeqItem(p.offset, p.length, b"x" * 32, p.modality, p.tower_inputs) for p in placed]
    offset = placed[0].offset
    assert block_image_marks(placed, 0, 4) == b""  # text blocks: keys as without images
    assert block_image_marks(placed, 4, 4) != block_image_marks(placed, 8, 4) != b""
    assert block_image_marks(placed, 8, 4) != block_image_marks(other, 8, 4)
    assert block_image_marks(placed, 8, 4).endswith((8 - offset).to_bytes(8, "little"))


@pytest.mark.parametrize("encoder_cache_memory,encodes", [(None, 1), (1, 2)])
def test_a_preempted_image_request_is_recomputed_to_transformers_tokens(checkpoints, encoder_cache_memory, encodes):
    """Its soft tokens come back from the encoder cache, or (a cache too small to keep them) from the tower again."""
    path, ref = vision_checkpoint(checkpoints, "dense", "clipped", True)
    engine = LLM(str(path), **ENGINE, enable_prefix_caching=False, encoder_cache_memory=encoder_cache_memory).engine
    prompt = image_prompt(items_of(["tall"], seed=3))
    seq = engine.add_request("r", prompt.prompt_token_ids, greedy(6), multimodal=prompt)
    for _ in range(3):
        engine.step()
    engine.scheduler._preempt(seq)
    assert seq.num_computed_tokens == 0 and seq.num_output_tokens == 3
    while engine.has_unfinished():
        engine.step()
    assert_matches(output(seq), transformers_greedy(ref, prompt, 6))
    assert engine.runner.images.num_encoded == encodes
    assert all(used == 0 for _, used, _ in engine.kv.usage())


def test_two_tensor_parallel_ranks_serve_images_as_transformers(checkpoints):
    path, ref = vision_checkpoint(checkpoints, "dense", "standardized", True)
    llm = LLM(str(path), **ENGINE, tensor_parallel_size=2)
    try:
        prompts = {"two": image_prompt(items_of(["landscape", "tall"], seed=6)), "text": [5, 9, 13],
                   "one": image_prompt(items_of(["tall"], seed=7), text=[8])}
        got = engine_greedy(llm.engine, prompts, 4)
        for name, prompt in prompts.items():
            want = transformers_greedy(ref, image_prompt([], text=prompt) if name == "text" else prompt, 4)
            assert_matches(got[name], want)
    finally:
        llm.engine.close()


def greedy_params():
    return greedy(2)


def output(seq):
    return seq.output_token_ids, [lp[t] for lp, t in zip(seq.logprobs, seq.output_token_ids)]
