"""Images served end to end on a tiny random Gemma 4 with a real vision tower and a tokenizer: the openai client sends
a data-URL image to `atomlite serve`'s app, and the offline LLM.chat takes the same conversation; both give
transformers' greedy tokens and log-probs, and the usage block counts the image's soft tokens as prompt tokens."""
import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

from atomlite import LLM, SamplingParams
from atomlite.server.app import make_app
from image_prompts import transformers_greedy
from server_utils import running
from vision_checkpoint import tiny_vision_model_dir

NAME = "tiny-vision"
MAX_TOKENS = 4


def png_url(height: int, width: int, seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def messages(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is in it?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_vision_model_dir(tmp_path_factory.mktemp("tiny-vision") / "model")


@pytest.fixture(scope="module")
def llm(model):
    return LLM(str(model[0]), dtype="float32", device="cpu", mm_processor_kwargs={"max_soft_tokens": 70})


@pytest.fixture(scope="module")
def expected(llm, model):
    """(the prompt the input side builds, transformers' greedy tokens and log-probs for it) per image seed."""
    def of(url: str):
        prompt = llm._multimodal.chat(messages(url), None, None, None, True)
        return prompt, transformers_greedy(model[1], prompt, MAX_TOKENS, llm.engine.model.vision_spec.image_token_id)
    return of


def test_openai_client_with_a_data_url_image_gets_transformers_tokens_and_usage(llm, expected):
    url = png_url(40, 60, 1)
    prompt, (tokens, logprobs) = expected(url)
    with running(make_app(llm.engine, NAME)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(model=NAME, messages=messages(url), max_tokens=MAX_TOKENS,
                                             temperature=0, logprobs=True)
    choice = out.choices[0]
    assert choice.message.content == llm.tokenizer.decode(tokens, skip_special_tokens=True)
    np.testing.assert_allclose([t.logprob for t in choice.logprobs.content], logprobs, atol=1e-3, rtol=0)
    soft_tokens = prompt.items[0].num_soft_tokens
    assert out.usage.prompt_tokens == len(prompt.prompt_token_ids) > soft_tokens
    assert out.usage.completion_tokens == MAX_TOKENS


def test_offline_chat_with_an_image_gets_transformers_tokens(llm, expected):
    url = png_url(50, 30, 2)
    _, (tokens, _) = expected(url)
    out = llm.chat(messages(url), SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == tokens
