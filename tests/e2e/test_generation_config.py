"""A checkpoint's generation_config.json sets the defaults of what a request leaves out, as vLLM's
`--generation-config auto` does, and never overrides what a request sets; its end-of-sequence ids stop the output."""
import json

import openai
import pytest

from atomlite import LLM, SamplingParams
from atomlite.config import EngineConfig
from atomlite.demo import demo_model_dir
from atomlite.errors import ConfigError
from atomlite.generation_config import load_generation_defaults
from atomlite.server.app import make_app
from server_utils import running

PROMPT = "Question: 4 + 3 = ?\nAnswer:"


def checkpoint_with(folder, generation_config: dict):
    for f in demo_model_dir().iterdir():
        if f.name != "generation_config.json":
            (folder / f.name).symlink_to(f)
    (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


@pytest.fixture(scope="module")
def greedy_short_checkpoint(tmp_path_factory):
    """Defaults a request would not otherwise get: greedy, 5 tokens at most."""
    return checkpoint_with(tmp_path_factory.mktemp("gencfg"), {"temperature": 0.0, "max_new_tokens": 5,
                                                               "top_k": 50, "eos_token_id": [1, 4]})


@pytest.fixture(scope="module")
def client(greedy_short_checkpoint):
    llm = LLM(str(greedy_short_checkpoint), dtype="float32", max_model_len=256)
    with running(make_app(llm.engine, "gencfg")) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def sampled_texts(client, **fields) -> list[str]:
    return [client.completions.create(model="gencfg", prompt=PROMPT, seed=seed, **fields).choices[0].text
            for seed in (1, 2, 3)]


def test_the_file_sets_what_the_request_leaves_out(client):
    greedy = client.completions.create(model="gencfg", prompt=PROMPT, temperature=0, max_tokens=5).choices[0].text
    assert sampled_texts(client) == [greedy] * 3  # temperature 0 and 5 tokens from the file
    unset = client.completions.create(model="gencfg", prompt=PROMPT, temperature=0)
    assert unset.usage.completion_tokens == 5


def test_what_the_request_sets_wins_over_the_file(client):
    hot = sampled_texts(client, temperature=1.5, max_tokens=12)
    assert len(set(hot)) > 1  # sampled, not the file's greedy
    longer = client.completions.create(model="gencfg", prompt=PROMPT, temperature=0, max_tokens=12,
                                       extra_body={"ignore_eos": True})
    assert longer.usage.completion_tokens == 12


def test_a_value_equal_to_transformers_default_sets_nothing_and_vllm_mode_reads_none(greedy_short_checkpoint):
    auto = load_generation_defaults(greedy_short_checkpoint)
    assert auto.sampling == {"temperature": 0.0, "max_tokens": 5}  # top_k 50 is transformers' default: vLLM drops it
    assert "temperature=0.0, max_tokens=5" in auto.describe() and "generation_config.json" in auto.describe()
    plain = load_generation_defaults(greedy_short_checkpoint, "vllm")
    assert plain.sampling == {} and plain.eos_token_ids == (1, 4)
    over = load_generation_defaults(greedy_short_checkpoint, "vllm", '{"top_p": 0.5}')
    assert over.sampling == {"top_p": 0.5}


def test_offline_defaults_come_from_the_file_unless_params_are_given(greedy_short_checkpoint):
    llm = LLM(str(greedy_short_checkpoint), dtype="float32", max_model_len=256)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, max_tokens=5)
    assert len(llm.generate(PROMPT)[0].outputs[0].token_ids) == 5
    given = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))[0]
    assert len(given.outputs[0].token_ids) == 9


def test_generation_config_folder_and_its_eos_ids(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"top_p": 0.25, "eos_token_id": 7}))
    config = EngineConfig(model=str(demo_model_dir()), generation_config=str(other))
    assert config.generation_defaults.sampling == {"top_p": 0.25}
    assert config.generation_defaults.eos_token_ids == (7,)
    with pytest.raises(ConfigError, match="no generation_config.json"):
        EngineConfig(model=str(demo_model_dir()), generation_config=str(tmp_path))


def test_an_extra_eos_id_in_the_file_stops_generation(tmp_path):
    plain = LLM(str(demo_model_dir()), dtype="float32", max_model_len=256)
    out = plain.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=False))[0].outputs[0]
    stop_at = out.token_ids[3]
    (tmp_path / "eos").mkdir()
    folder = checkpoint_with(tmp_path / "eos", {"eos_token_id": [1, stop_at]})
    ended = LLM(str(folder), dtype="float32", max_model_len=256).generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    assert ended.token_ids == out.token_ids[:out.token_ids.index(stop_at) + 1]
    assert ended.finish_reason == "stop"
