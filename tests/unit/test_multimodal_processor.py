"""Gemma 4's multimodal processor against transformers' Gemma4Processor (images: token ids, pixel values,
patch positions, soft-token counts) and against the video processor's arithmetic (frames, timestamps)."""
import numpy as np
import pytest
import torch
from PIL import Image

from atomlite.multimodal.inputs import placeholder_runs
from atomlite.multimodal.processor import MultiModalProcessor
from atomlite.multimodal.video import sample_indices
from atomlite.tokenizer import load_tokenizer
from vision_checkpoint import reference_processor, text_only_model_dir, vision_model_dir

SIZES = [(100, 150), (480, 640), (37, 500), (1000, 20), (48, 48), (1200, 1600), (3, 900)]
SOFT_TOKENS = (70, 140, 280, 560, 1120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vision_model_dir(tmp_path_factory.mktemp("vision") / "model")


@pytest.fixture(scope="module")
def processors(model_dir):
    return MultiModalProcessor.from_model_dir(model_dir, load_tokenizer(model_dir)), reference_processor(model_dir)


def random_image(height: int, width: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels, mode)


@pytest.mark.parametrize("height,width", SIZES)
@pytest.mark.parametrize("max_soft_tokens", SOFT_TOKENS)
def test_image_prompt_equals_transformers_gemma4_processor(processors, height, width, max_soft_tokens):
    ours, reference = processors
    image, text = random_image(height, width, seed=height * width), "Look at <|image|> please"
    want = reference(text=[text], images=[[image]], return_tensors="pt",
                     images_kwargs={"max_soft_tokens": max_soft_tokens})
    want_tokens = reference.image_processor(images=[image], max_soft_tokens=max_soft_tokens)
    got = ours.process(text, [image], mm_processor_kwargs={"max_soft_tokens": max_soft_tokens})
    item = got.items[0]
    assert got.prompt_token_ids == want["input_ids"][0].tolist()
    assert torch.equal(item.pixel_values, want["pixel_values"][0])
    assert torch.equal(item.image_position_ids, want["image_position_ids"][0])
    assert item.num_soft_tokens == want_tokens["num_soft_tokens_per_image"][0]


def test_several_images_and_transparency_equal_transformers(processors):
    ours, reference = processors
    images = [random_image(200, 90, 1), random_image(64, 300, 2, mode="RGBA"), random_image(500, 500, 3)]
    text = "<|image|> first, then <|image|>\nand <|image|>."
    want = reference(text=[text], images=[images], return_tensors="pt")
    got = ours.process(text, images)
    assert got.prompt_token_ids == want["input_ids"][0].tolist()
    for i, item in enumerate(got.items):
        assert torch.equal(item.pixel_values, want["pixel_values"][i])
        assert torch.equal(item.image_position_ids, want["image_position_ids"][i])


def test_a_prompt_of_token_ids_expands_like_its_text(processors):
    ours, _ = processors
    images, text = [random_image(90, 120, 4), random_image(300, 40, 5)], "a <|image|> b <|image|> c"
    from_text = ours.process(text, images)
    from_ids = ours.process(ours.tokenizer.encode(text), images)
    assert from_ids.prompt_token_ids == from_text.prompt_token_ids
    assert from_ids.placeholder_ranges == from_text.placeholder_ranges


def test_placeholder_ranges_cover_exactly_each_items_soft_tokens(processors):
    ours, _ = processors
    t = ours.tokens
    video = np.random.default_rng(6).integers(0, 256, (3, 60, 80, 3), dtype=np.uint8)
    got = ours.process("<|image|> x <|video|> y <|image|>", [random_image(50, 70, 7), random_image(70, 50, 8)],
                       [video])
    assert [item.modality for item in got.items] == ["image", "video", "video", "video", "image"]
    ids = got.prompt_token_ids
    for item, (offset, length) in zip(got.items, got.placeholder_ranges):
        placeholder = t.image_id if item.modality == "image" else t.video_id
        assert length == item.num_soft_tokens
        assert ids[offset - 1] == t.boi_id and ids[offset + length] == t.eoi_id
        assert set(ids[offset:offset + length]) == {placeholder}
    covered = sum(length for _, length in got.placeholder_ranges)
    assert covered == sum(token in (t.image_id, t.video_id) for token in ids)


def test_placeholder_runs_are_found_in_the_ids():
    assert placeholder_runs([1, 7, 7, 2, 7, 3, 8, 8, 8], {7, 8}) == [(1, 2), (4, 1), (6, 3)]
    assert placeholder_runs([7, 8, 8], {7, 8}) == [(0, 1), (1, 2)]
    assert placeholder_runs([1, 2], {7}) == []


def test_a_placeholder_count_unlike_the_images_names_both_counts(processors):
    ours, _ = processors
    with pytest.raises(ValueError, match=r"2 image placeholders \(<\|image\|>\) but 1 images were given"):
        ours.process("<|image|><|image|>", [random_image(40, 40)])
    with pytest.raises(ValueError, match=r"0 video placeholders .* but 1 videos were given"):
        ours.process("text", [], [np.zeros((2, 32, 32, 3), np.uint8)])


@pytest.mark.parametrize("value", [100, 0, "280", True])
def test_max_soft_tokens_outside_gemma4s_set_is_an_error_naming_the_field(processors, value):
    ours, _ = processors
    with pytest.raises(ValueError, match=r"mm_processor_kwargs.max_soft_tokens: .* is not one of 70, 140, 280"):
        ours.process("<|image|>", [random_image(40, 40)], mm_processor_kwargs={"max_soft_tokens": value})
    with pytest.raises(ValueError, match=r"mm_processor_kwargs.num_crops is not a processor setting"):
        ours.process("<|image|>", [random_image(40, 40)], mm_processor_kwargs={"num_crops": 4})


def test_checkpoint_max_soft_tokens_is_the_default_and_a_request_overrides_it(model_dir):
    tokenizer = load_tokenizer(model_dir)
    processor = MultiModalProcessor.from_model_dir(model_dir, tokenizer, {"max_soft_tokens": 70})
    image = random_image(480, 640)
    assert processor.process("<|image|>", [image]).items[0].num_soft_tokens == 63
    assert processor.process("<|image|>", [image], mm_processor_kwargs={"max_soft_tokens": 1120}).items[0].num_soft_tokens == 1064


def test_same_pixels_hash_alike_and_a_different_image_or_budget_does_not(processors):
    ours, _ = processors
    image = random_image(120, 160, 9)
    again = Image.fromarray(np.asarray(image).copy())
    one_pixel = np.asarray(image).copy()
    one_pixel[5, 5, 0] ^= 1

    def digest(img, **kwargs):
        return ours.process("<|image|>", [img], mm_processor_kwargs=kwargs or None).items[0].content_hash

    assert digest(image) == digest(again)
    assert digest(image) != digest(Image.fromarray(one_pixel))
    assert digest(image) != digest(image, max_soft_tokens=560)
    assert digest(image) != digest(Image.fromarray(np.asarray(image)[:, :80]))


def test_a_text_only_checkpoint_has_no_multimodal_processor(tmp_path):
    text_only = text_only_model_dir(tmp_path / "model")
    with pytest.raises(ValueError, match="has no vision tower"):
        MultiModalProcessor.from_model_dir(text_only, load_tokenizer(text_only))
