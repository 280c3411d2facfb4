"""A vLLM user's habits: `atomlite serve` started with vLLM's flags, sent OpenAI's fields through the openai client
and vLLM's extras as raw JSON; each is honoured (its effect checked here) or has no effect by its meaning (the output
is unchanged), and none is a 400. Flags atomlite cannot honour are refused with one line."""
import json

import httpx
import openai
import pytest
from click.testing import CliRunner

from atomlite.accuracy.runner import free_port, start_server, stop_server
from atomlite.cli import main
from atomlite.demo import demo_model_dir

ORIGIN = "http://app.example"
MESSAGES = [{"role": "user", "content": "What is 7 + 5?"}]
PROMPT = "Question: 7 + 5 = ?\nAnswer:"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dropin")
    gen = folder / "gen"
    gen.mkdir()
    (gen / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))  # greedy unless asked
    flags = [str(demo_model_dir()), "--served-model-name", "dropin", "other", "--dtype", "float", "--seed", "7",
             "--enable-prefix-caching", "--generation-config", str(gen), "--tokenizer", str(demo_model_dir()),
             "--trust-remote-code", "--tokenizer-mode", "auto", "--disable-log-requests", "--max-model-len", "2048",
             "--allowed-origins", json.dumps([ORIGIN]), "--allowed-methods", '["GET", "POST"]',
             "--allowed-headers", '["content-type", "authorization"]', "--enable-auto-tool-choice",
             "--tool-call-parser", "gemma4", "--scheduling-policy", "priority"]
    log = folder / "server.log"
    # start_server adds --model and --served-model-name atomlite-eval: the names given here come after it
    proc, base = start_server(demo_model_dir(), flags, log)
    try:
        yield base, log
    finally:
        stop_server(proc)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)


def post(server, path: str, body: dict) -> dict:
    response = httpx.post(f"{server[0]}{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def chat(server, **fields) -> dict:
    return post(server, "/v1/chat/completions", {"model": "dropin", "messages": MESSAGES, "max_tokens": 12,
                                                 "temperature": 0, **fields})


def complete(server, **fields) -> dict:
    return post(server, "/v1/completions", {"model": "dropin", "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                            **fields})


def test_startup_names_the_defaults_the_parsers_and_each_no_effect_flag(server):
    log = server[1].read_text()
    assert "sampling defaults from " in log and "temperature=0.0" in log
    assert "--trust-remote-code: no effect here" in log and "--tokenizer-mode auto: no effect here" in log
    assert "--disable-log-requests: no effect here" in log
    assert "dtype float32" in log
    assert "--reasoning-parser auto: off (the chat template never writes <|channel>); thinking stays in content" in log


def test_every_served_name_is_answered(server, client):
    assert {m.id for m in client.models.list().data} == {"dropin", "other"}
    for name in ("dropin", "other"):
        assert client.completions.create(model=name, prompt=PROMPT, max_tokens=2).choices[0].text
    assert httpx.post(f"{server[0]}/v1/completions", json={"model": "third", "prompt": "x"}).status_code == 404


def test_openai_fields_with_no_effect_leave_the_answer_unchanged(client):
    plain = client.chat.completions.create(model="dropin", messages=MESSAGES, max_completion_tokens=12)
    given = client.chat.completions.create(
        model="dropin", messages=MESSAGES, max_completion_tokens=12, user="u1", store=False,
        metadata={"team": "a"}, service_tier="auto", modalities=["text"], verbosity="low",
        prediction={"type": "content", "content": "12"}, safety_identifier="s1", prompt_cache_key="k1",
        frequency_penalty=0.0, presence_penalty=0.0, logit_bias={}, parallel_tool_calls=True, top_p=1.0,
        n=1, stop=None, stream_options=None, seed=3)
    assert given.choices[0].message.content == plain.choices[0].message.content  # greedy from the config folder


def test_openai_fields_that_change_the_answer_are_honoured(client):
    two = client.chat.completions.create(model="dropin", messages=MESSAGES, max_tokens=8, n=2, temperature=1.5,
                                         seed=11, logprobs=True, top_logprobs=2)
    assert [c.index for c in two.choices] == [0, 1] and all(len(c.logprobs.content[0].top_logprobs) == 2
                                                            for c in two.choices)
    stop = client.completions.create(model="dropin", prompt=PROMPT, max_tokens=12, stop=["="])
    assert "=" not in stop.choices[0].text and stop.choices[0].finish_reason == "stop"
    streamed = list(client.chat.completions.create(model="dropin", messages=MESSAGES, max_tokens=6, stream=True,
                                                   stream_options={"include_usage": True}))
    assert streamed[-1].usage.completion_tokens <= 6
    thinking = client.chat.completions.create(model="dropin", messages=MESSAGES, max_tokens=1, reasoning_effort="low")
    plain = client.chat.completions.create(model="dropin", messages=MESSAGES, max_tokens=1)
    off = client.chat.completions.create(model="dropin", messages=MESSAGES, max_tokens=1, reasoning_effort="none")
    assert thinking.usage.prompt_tokens > plain.usage.prompt_tokens == off.usage.prompt_tokens  # <|think|> added


def test_vllm_stop_and_special_token_fields(server):
    cut = complete(server, stop=["="])["choices"][0]
    kept = complete(server, stop=["="], include_stop_str_in_output=True)["choices"][0]
    assert kept["text"] == cut["text"] + "=" and kept["stop_reason"] == "="
    eos = complete(server, stop_token_ids=[6], max_tokens=12)["choices"][0]
    assert eos["stop_reason"] == 6 and eos["finish_reason"] == "stop"
    assert complete(server, skip_special_tokens=False, spaces_between_special_tokens=False, length_penalty=1.0,
                    stream_interval=2, session_id="s")["choices"][0]["text"] == complete(server)["choices"][0]["text"]
    forced = complete(server, ignore_eos=True, min_tokens=12, top_k=0, min_p=0.0, repetition_penalty=1.0)
    assert forced["usage"]["completion_tokens"] == 12


def test_vllm_prompt_fields(server):
    whole = complete(server, max_tokens=1)["usage"]["prompt_tokens"]
    assert complete(server, max_tokens=1, truncate_prompt_tokens=5)["usage"]["prompt_tokens"] == 5
    bare = post(server, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False})["count"]
    assert complete(server, max_tokens=1, add_special_tokens=False)["usage"]["prompt_tokens"] == bare
    body = complete(server, max_tokens=1, prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    assert len(body) == whole and body[0] is None
    assert all(1 <= len(entry) <= 3 and all({"logprob", "rank", "decoded_token"} == set(v) for v in entry.values())
               for entry in body[1:])
    top = [min(entry.values(), key=lambda v: v["rank"]) for entry in body[1:]]
    assert all(v["rank"] == 1 for v in top)


def test_vllm_chat_rendering_fields_and_tokenize_agree(server):
    prefill = MESSAGES + [{"role": "assistant", "content": "The answer is"}]
    fields = {"add_generation_prompt": False, "continue_final_message": True, "chat_template_kwargs":
              {"enable_thinking": True}, "documents": [{"title": "t", "text": "d"}]}
    answer = chat(server, messages=prefill, echo=True, return_token_ids=True, **fields)
    assert answer["choices"][0]["message"]["content"].startswith("The answer is")
    tokens = post(server, "/tokenize", {"model": "dropin", "messages": prefill, **fields})
    assert tokens["tokens"] == answer["prompt_token_ids"]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}}}}}]
    with_tools = chat(server, tools=tools, max_tokens=1, return_token_ids=True)
    assert post(server, "/tokenize", {"messages": MESSAGES, "tools": tools})["tokens"] == \
        with_tools["prompt_token_ids"]


def test_vllm_response_fields(server):
    named = chat(server, request_id="my-request-1", logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True,
                 prompt_logprobs=0, priority=-1, include_reasoning=False, bad_words=["zebra"],
                 allowed_token_ids=list(range(128)), structured_outputs=None)
    assert named["id"] == "chatcmpl-my-request-1"
    assert all(t["token"].startswith("token_id:") for t in named["choices"][0]["logprobs"]["content"])
    assert named["prompt_logprobs"][0] is None and len(named["prompt_logprobs"]) == named["usage"]["prompt_tokens"]


def test_unknown_and_unsupported_fields_are_400s_naming_them(server):
    for body, words in (({"frobnicate": 1}, "frobnicate"), ({"use_beam_search": True}, "beam search"),
                        ({"logits_processors": ["x"]}, "logits_processors"), ({"audio": {"voice": "a"}}, "audio"),
                        ({"cache_salt": "abc"}, "--no-enable-prefix-caching"), ({"chat_template": "{{ 1 }}"},
                                                                                    "--trust-request-chat-template")):
        response = httpx.post(f"{server[0]}/v1/chat/completions",
                              json={"model": "dropin", "messages": MESSAGES, **body})
        assert response.status_code == 400 and words in response.text, response.text


def test_cors_answers_the_allowed_origin_only(server):
    preflight = httpx.options(f"{server[0]}/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(f"{server[0]}/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers
    answer = httpx.post(f"{server[0]}/v1/completions", headers={"Origin": ORIGIN},
                        json={"model": "dropin", "prompt": PROMPT, "max_tokens": 1})
    assert answer.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.parametrize("args, words", [
    (["--lora-modules", "a=/tmp/a"], "--lora-modules needs --enable-lora"),
    (["--pipeline-parallel-size", "2"], "no pipeline parallelism"),
    (["--quantization", "fp8"], "is not quantized, and atomlite does not quantize at load time"),
    (["--tokenizer-mode", "mistral"], "--tokenizer-mode mistral: atomlite takes only auto or hf"),
    (["--allowed-methods", '["GET"]'], "need --allowed-origins"),
])
def test_flags_atomlite_cannot_honour_are_refused_in_one_line(args, words):
    result = CliRunner().invoke(main, ["serve", str(demo_model_dir()), "--port", str(free_port()), *args])
    assert result.exit_code == 2 and words in result.output, result.output


def test_cors_is_off_without_allowed_origins(random_model_dir):
    from atomlite import LLM
    from atomlite.server.app import make_app
    from server_utils import running
    llm = LLM(str(random_model_dir), dtype="float32", max_model_len=128)
    with running(make_app(llm.engine, "tiny")) as base:
        preflight = httpx.options(f"{base}/v1/completions", headers={"Origin": ORIGIN,
                                                                     "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
FORCE = {"type": "function", "function": {"name": "get_weather"}}


def test_a_forced_call_cut_by_max_tokens_is_what_was_generated(client):
    whole = client.chat.completions.create(model="dropin", messages=MESSAGES, tools=[WEATHER], tool_choice=FORCE,
                                           max_tokens=150)
    full = whole.choices[0].message.tool_calls[0].function.arguments
    assert whole.choices[0].finish_reason == "tool_calls" and "city" in json.loads(full)
    for max_tokens in (18, 30):  # the marker and name are about 16 tokens of the demo's tokenizer
        cut = client.chat.completions.create(model="dropin", messages=MESSAGES, tools=[WEATHER], tool_choice=FORCE,
                                             max_tokens=max_tokens)
        assert cut.choices[0].finish_reason == "length"
        calls = cut.choices[0].message.tool_calls or []
        assert all(full.startswith(c.function.arguments) and c.function.arguments != full for c in calls)


def test_a_streamed_forced_call_sends_no_empty_deltas(client):
    chunks = list(client.chat.completions.create(model="dropin", messages=MESSAGES, tools=[WEATHER],
                                                 tool_choice=FORCE, max_tokens=150, stream=True))
    deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks if c.choices]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(d for d in deltas[1:-1]), deltas
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_pydantic_tool_with_refs_is_forced_and_validates(client):
    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=12)
        zip: int

    class Letter(BaseModel):
        to: Address
        copies: list[Address] = Field(max_length=2)

    tool = openai.pydantic_function_tool(Letter)
    assert "$ref" in json.dumps(tool)
    answer = client.chat.completions.create(model="dropin", messages=MESSAGES, tools=[tool], max_tokens=500,
                                            tool_choice={"type": "function", "function": {"name": "Letter"}})
    assert answer.choices[0].finish_reason == "tool_calls"
    Letter.model_validate_json(answer.choices[0].message.tool_calls[0].function.arguments)


def test_a_request_chat_template_is_used_when_the_server_trusts_it():
    from atomlite import LLM
    from atomlite.server.app import make_app
    from atomlite.server.chat import ChatOptions
    from server_utils import running
    llm = LLM(str(demo_model_dir()), dtype="float32", max_model_len=512)
    template = "{{ 'Question: Ava has 7 pens and gets 5 more. How many pens does Ava have now?\\nAnswer:' }}"
    with running(make_app(llm.engine, "demo", chat_options=ChatOptions(trust_request_chat_template=True))) as base:
        reply = httpx.post(f"{base}/v1/chat/completions", json={
            "model": "demo", "messages": MESSAGES, "chat_template": template, "max_tokens": 16, "temperature": 0},
            timeout=60).json()
    assert reply["choices"][0]["message"]["content"].startswith(" 7 + 5 = 12"), reply


def test_quantization_must_name_the_checkpoints_own_method():
    from types import SimpleNamespace

    from atomlite.config import check_quantization
    from atomlite.errors import ConfigError
    quark = SimpleNamespace(path="ckpt", hf={"quantization_config": {"quant_method": "quark"}})
    check_quantization("quark", quark)  # vLLM's name for it: taken
    check_quantization(None, quark)
    with pytest.raises(ConfigError, match="--quantization fp8 does not match the checkpoint's quantization_config"):
        check_quantization("fp8", quark)


def test_vllm_dtype_aliases():
    from atomlite.config import EngineConfig
    assert EngineConfig(model=str(demo_model_dir()), dtype="half").dtype == "float16"
    assert EngineConfig(model=str(demo_model_dir()), dtype="float").dtype == "float32"


def test_offline_chat_continues_the_final_message():
    from atomlite import LLM, SamplingParams
    llm = LLM(str(demo_model_dir()), dtype="float32", max_model_len=256)
    messages = [{"role": "user", "content": "What is 7 + 5?"}, {"role": "assistant", "content": "7 + 5"}]
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=6)
    want = llm.generate(ids, params)[0].outputs[0].text
    got = llm.chat(messages, params, add_generation_prompt=False, continue_final_message=True)[0]
    assert got.prompt_token_ids == list(ids) and got.outputs[0].text == want
    with pytest.raises(ValueError, match="add_generation_prompt=False"):
        llm.chat(messages, params, continue_final_message=True)
