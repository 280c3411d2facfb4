"""Images and video frames through the real server and the openai client, up to the engine hand-off: a chat's
image_url and video_url parts are fetched under the media flags, rendered where the chat template puts them and
processed into the prompt transformers' Gemma4Processor builds; every refusal is a 400 naming the part or the
limit. This checkpoint's engine has no tower, so a parsed request ends in the engine's 400 (test_server_images.py
serves images on a checkpoint with one)."""
import asyncio
import base64
import io

import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from atomlite import LLM
from atomlite.server.app import make_app
from atomlite.server.protocol import ChatCompletionRequest
from server_utils import running
from vision_checkpoint import reference_processor, text_only_model_dir, video_bytes, vision_model_dir

NAME = "vision"
# the demo-based vision checkpoint declares a vision_config but carries no tower: its engine refuses images
NO_TOWER = "has no vision tower: it takes text only"


def png_url(height: int, width: int, seed: int = 0) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "cat.png").write_bytes(base64.b64decode(png_url(40, 60, 3).split(",")[1]))
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vision_model_dir(tmp_path_factory.mktemp("vision") / "model")


@pytest.fixture(scope="module")
def app(model_dir, media_dir):
    engine = LLM(str(model_dir), device="cpu", max_model_len=2048, limit_mm_per_prompt={"image": 2, "video": 1},
                 allowed_local_media_path=str(media_dir)).engine
    return make_app(engine, NAME)


@pytest.fixture(scope="module")
def server(app):
    with running(app) as base:
        yield base


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def ask(client, content, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": content}], max_tokens=4,
                                          **kw)


def test_chat_image_prompt_equals_transformers_processor_on_the_rendered_template(app, model_dir):
    images = [png_url(90, 120, 1), png_url(300, 40, 2)]
    body = {"model": NAME, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Compare "}, image_part(images[0]),
                                     {"type": "text", "text": " with "}, image_part(images[1])]}],
            "mm_processor_kwargs": {"max_soft_tokens": 140}}
    ids, prompt = asyncio.run(app.state.server.chat_prompt(ChatCompletionRequest.model_validate(body)))
    reference = reference_processor(model_dir)
    template_messages = [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                                      {"type": "text", "text": " with "}, {"type": "image"}]}]
    text = reference.tokenizer.apply_chat_template(template_messages, tokenize=False, add_generation_prompt=True)
    pil = [Image.open(io.BytesIO(base64.b64decode(u.split(",")[1]))) for u in images]
    want = reference(text=[text], images=[pil], return_tensors="pt", add_special_tokens=False,
                     images_kwargs={"max_soft_tokens": 140})
    assert ids == prompt.prompt_token_ids == want["input_ids"][0].tolist()
    for i, item in enumerate(prompt.items):
        assert torch.equal(item.pixel_values, want["pixel_values"][i])
    assert [length for _, length in prompt.placeholder_ranges] == [item.num_soft_tokens for item in prompt.items]


def test_a_parsed_image_request_reaches_the_engine(client, media_dir):
    for url in (png_url(50, 50), f"file://{media_dir}/cat.png"):
        with pytest.raises(openai.BadRequestError, match=NO_TOWER):
            ask(client, [{"type": "text", "text": "What is this?"}, image_part(url)])


def test_a_video_url_is_decoded_and_reaches_the_engine(client):
    url = "data:video/mp4;base64," + base64.b64encode(video_bytes(12, 4)).decode()
    with pytest.raises(openai.BadRequestError, match=NO_TOWER):
        ask(client, [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What happens?"}])


@pytest.mark.parametrize("content,needle", [
    ([image_part("http://127.0.0.1:9/a.png")], "messages[0].content[0].image_url: fetching from '127.0.0.1' is not "
                                               "allowed"),
    ([{"type": "text", "text": "x"}, image_part("file:///etc/passwd")],
     "messages[0].content[1].image_url: file:// URLs must name a file under --allowed-local-media-path"),
    ([image_part(png_url(8, 8))] * 3, "the prompt has 3 images, over the limit of 2 per prompt"),
    ([image_part("data:text/plain;base64,aGk=")], "messages[0].content[0].image_url: a data: URL of type"),
    # a placeholder typed in the text stays text (chat content is text): one image, which this model cannot take
    ([{"type": "text", "text": "two <|image|> placeholders"}, image_part(png_url(8, 8))], "has no vision tower"),
    ([{"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}],
     "messages[0].content[0].input_audio: the model vision takes no audio"),
    ([{"type": "file", "file": {"file_id": "f"}}], "file content is not supported"),
])
def test_what_cannot_be_read_is_a_400_naming_the_part_or_the_limit(client, content, needle):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, content)
    assert e.value.status_code == 400 and needle in e.value.body["message"], e.value.body


def test_a_bad_max_soft_tokens_is_a_400_naming_the_field(server):
    for route, body in (("chat/completions", {"messages": [{"role": "user", "content": [image_part(png_url(8, 8))]}]}),
                        ("completions", {"prompt": "hi"})):
        r = httpx.post(f"{server}/v1/{route}", json={"model": NAME, "mm_processor_kwargs": {"max_soft_tokens": 300},
                                                      **body}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "mm_processor_kwargs", error
        assert "max_soft_tokens: 300 is not one of 70, 140, 280, 560, 1120" in error["message"]


def test_text_chat_still_runs_on_a_vision_model(client):
    out = ask(client, [{"type": "text", "text": "hi"}])
    assert out.choices[0].finish_reason in ("stop", "length")


def test_an_image_for_a_text_only_model_is_a_400_naming_the_model(tmp_path):
    engine = LLM(str(text_only_model_dir(tmp_path / "model")), device="cpu", max_model_len=256).engine
    with running(make_app(engine, "demo")) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="demo", max_tokens=2, messages=[
                {"role": "user", "content": [image_part(png_url(8, 8))]}])
        assert "the model demo is a text-only model" in e.value.body["message"]
        assert e.value.body["param"] == "messages"


def test_tokenize_refuses_media_it_would_not_fetch(server):
    r = httpx.post(f"{server}/tokenize", json={"model": NAME, "messages": [
        {"role": "user", "content": [image_part(png_url(8, 8))]}]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "/tokenize does not fetch images or videos" in r.json()["error"]["message"]
