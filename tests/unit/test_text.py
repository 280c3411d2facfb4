"""Text in, text out: tokenizer round trip, stop strings."""
import pytest

from atomlite import LLM, SamplingParams
from random_model import build_random_model


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("random") / "tiny"
    build_random_model(path)
    return LLM(str(path), dtype="float32", device="cpu")


def test_text_prompt_is_tokenized_and_output_detokenized(llm):
    out = llm.generate("Question: 2+2?", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("Question: 2+2?")
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)


def test_stop_string_truncates_text_and_ends_with_stop(llm):
    free = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[0]
    visible = free.text.strip()
    assert len(visible) >= 6
    stop = visible[3:5]
    cut = free.text.index(stop)
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]))[0]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].text == free.text[:cut]
    assert out.outputs[0].token_ids == free.token_ids[:len(out.outputs[0].token_ids)]
