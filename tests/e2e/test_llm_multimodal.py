"""The offline API's images and videos in vLLM's shapes, up to the engine (whose model here has no tower): prompt
dicts with multi_modal_data and mm_processor_kwargs, limit_mm_per_prompt, and LLM.chat's image_url parts."""
import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from atomlite import LLM, SamplingParams
from vision_checkpoint import reference_processor, text_only_model_dir, vision_model_dir

# the demo-based vision checkpoint declares a vision_config but carries no tower: its engine refuses images
NO_TOWER = "has no vision tower: it takes text only"


def image(height: int, width: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vision_model_dir(tmp_path_factory.mktemp("vision") / "model")


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), device="cpu", max_model_len=2048, limit_mm_per_prompt={"image": 2, "video": 1},
               mm_processor_kwargs={"max_soft_tokens": 70})


def test_a_prompt_dict_with_images_is_processed_as_transformers_does(llm, model_dir):
    images = [image(100, 150, 1), image(64, 64, 2)]
    prompt = {"prompt": "<|image|> and <|image|>?", "multi_modal_data": {"image": images},
              "mm_processor_kwargs": {"max_soft_tokens": 280}}
    _, processed = llm._multimodal.prompt_dict(prompt)
    want = reference_processor(model_dir)(text=["<|image|> and <|image|>?"], images=[images], return_tensors="pt")
    assert processed.prompt_token_ids == want["input_ids"][0].tolist()
    assert all(torch.equal(item.pixel_values, want["pixel_values"][i]) for i, item in enumerate(processed.items))


def test_the_engine_configs_mm_processor_kwargs_are_the_default(llm):
    _, processed = llm._multimodal.prompt_dict({"prompt": "<|image|>", "multi_modal_data": {"image": image(480, 640)}})
    assert processed.items[0].num_soft_tokens == 63  # 70-token budget


def test_generate_with_images_or_frames_reaches_the_engine(llm):
    frames = np.random.default_rng(3).integers(0, 256, (4, 40, 56, 3), dtype=np.uint8)
    for data in ({"image": image(40, 40)}, {"video": frames}, {"video": (list(frames), {"fps": 2.0})}):
        prompt = "<|image|> what?" if "image" in data else "<|video|> what?"
        with pytest.raises(ValueError, match=NO_TOWER):
            llm.generate({"prompt": prompt, "multi_modal_data": data}, SamplingParams(max_tokens=2))


def test_text_prompt_dicts_generate_like_plain_prompts(llm):
    params = SamplingParams(max_tokens=4, temperature=0)
    plain = llm.generate(["hello there"], params)[0]
    from_dict = llm.generate([{"prompt": "hello there"}], params)[0]
    from_ids = llm.generate({"prompt_token_ids": plain.prompt_token_ids}, params)[0]
    assert from_dict.outputs[0].token_ids == plain.outputs[0].token_ids == from_ids.outputs[0].token_ids
    assert from_dict.prompt == "hello there"


def test_more_images_than_limit_mm_per_prompt_is_an_error_naming_the_limit(llm):
    with pytest.raises(ValueError, match=r"3 images, over the limit of 2 per prompt \(limit_mm_per_prompt"):
        llm.generate({"prompt": "<|image|>" * 3, "multi_modal_data": {"image": [image(8, 8)] * 3}})


@pytest.mark.parametrize("prompt,needle", [
    ({"prompt": "x", "multi_modal_data": {"audio": [1]}}, "multi_modal_data.audio"),
    ({"prompt": "x", "prompt_token_ids": [1]}, "exactly one of prompt or prompt_token_ids"),
    ({"text": "x"}, "prompt key 'text'"),
    ({"prompt": "<|image|>", "multi_modal_data": {"image": "cat.png"}}, r"multi_modal_data.image\[0\]: expected"),
])
def test_malformed_prompt_dicts_are_errors_naming_the_key(llm, prompt, needle):
    with pytest.raises(ValueError, match=needle):
        llm.generate(prompt)


def test_chat_with_an_image_url_reaches_the_engine(llm):
    out = io.BytesIO()
    image(30, 30).save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is it?"}]}]
    with pytest.raises(ValueError, match=NO_TOWER):
        llm.chat(messages, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\].image_url: fetching from 'example.com' is not"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": "http://example.com/a.png"}]}])


def test_chat_with_an_image_keeps_special_tokens_typed_in_its_text_as_text(llm):
    """A typed image placeholder (or any special token's text) stays text, as on the server: one image part, one
    image; the content guard's ids reach the processor."""
    out = io.BytesIO()
    image(30, 30).save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    guard = llm._content_guard()

    def prompt_ids(text: str) -> list[int]:
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                 {"type": "text", "text": text}]}]
        return llm._multimodal.chat(guard.mark(messages), None, None, None, True, guard).prompt_token_ids

    specials = set(llm.tokenizer.all_special_ids)
    typed, clean = prompt_ids("a <|image|> b"), prompt_ids("a b")
    assert sorted(t for t in typed if t in specials) == sorted(t for t in clean if t in specials)


def test_images_for_a_text_only_model_are_an_error_naming_it(tmp_path):
    llm = LLM(str(text_only_model_dir(tmp_path / "model")), device="cpu", max_model_len=256)
    with pytest.raises(ValueError, match="the model model has no vision tower"):
        llm.generate({"prompt": "<|image|>", "multi_modal_data": {"image": image(8, 8)}})
