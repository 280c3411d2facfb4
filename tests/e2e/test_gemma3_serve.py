"""Gemma 3 behind the user-facing paths: with a tokenizer (the demo's character tokenizer and chat template), LLM.chat
and the OpenAI server's chat endpoint give the tokens transformers' Gemma3ForCausalLM generates from the rendered
prompt, and a request with an image is refused by name (the model runs text only)."""
import openai
import pytest

from atomlite import LLM, SamplingParams
from atomlite.demo.tokenizer import save_char_tokenizer
from atomlite.server.app import make_app
from helpers import hf_greedy
from server_utils import running
from tiny_models import build_gemma3

NAME = "tiny-gemma3"
MESSAGES = [{"role": "user", "content": "What is a sliding window?"}]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3") / "tiny"
    ref = build_gemma3("gemma3_linear_softcap", path, vocab_size=128, max_position_embeddings=1024)
    save_char_tokenizer(path)
    return path, ref


@pytest.fixture(scope="module")
def llm(model):
    return LLM(str(model[0]), dtype="float32", device="cpu")


def expected_tokens(llm: LLM, ref) -> list[int]:
    prompt = llm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
    return hf_greedy(ref, list(prompt), MAX_TOKENS)


def test_llm_chat_gives_transformers_tokens(model, llm):
    out = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == expected_tokens(llm, model[1])
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)


def test_server_chat_completion_gives_transformers_text(model, llm):
    want = llm.tokenizer.decode(expected_tokens(llm, model[1]), skip_special_tokens=True)
    with running(make_app(llm.engine, NAME)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        resp = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert resp.choices[0].message.content == want
    assert resp.usage.completion_tokens == MAX_TOKENS


def test_a_prompt_with_an_image_is_refused_naming_the_model(llm):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(ValueError, match="has no vision tower"):
        llm.chat([{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}])
