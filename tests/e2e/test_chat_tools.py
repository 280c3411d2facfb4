"""Tool calls, thinking and the chat template through the real server and the openai client, on the demo model
(whose template writes tools, calls and results in Gemma 4's notation): forced calls always validate against the
tool's schema, an agent loop runs, streams join into the whole answer, and what cannot be honoured is a 400."""
import json

import httpx
import jsonschema
import openai
import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string as grammar_accepts

from atomlite import LLM, SamplingParams
from atomlite.demo import demo_model_dir
from atomlite.server.app import make_app
from atomlite.chat_template import template_messages
from atomlite.server.chat import ChatOptions, OutputParsers
from atomlite.server.parsers.gemma4_tools import render_tool_call
from atomlite.server.protocol import ChatMessage
from atomlite.server.tool_grammar import tool_call_grammar
from server_utils import running

NAME = "demo"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}, "alerts": {"type": "boolean"}}, "required": ["city", "days"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 10},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["query"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
PROMPTS = ["What is the weather in Paris?", "hi", "Find me a book", "Tell me a story about a cat.", "2+2?"]


@pytest.fixture(scope="module")
def engine():
    return LLM(str(demo_model_dir()), device="cpu", max_model_len=2048).engine


@pytest.fixture(scope="module")
def server(engine):
    with running(make_app(engine, NAME, chat_options=ChatOptions(reasoning_parser="gemma4"))) as base:
        yield base


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def chat(client, prompt, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}],
                                          temperature=0, **{"max_tokens": 120, **kw})


# -- the grammar that forces calls ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args,accepted", [
    ({"city": "Paris", "days": 3}, True),
    ({"alerts": False, "city": "Paris", "days": -2, "unit": "celsius"}, True),
    ({"city": "Paris"}, False),  # a required property missing
    ({"city": "x" * 13, "days": 1}, False),  # past maxLength
    ({"city": "Paris", "days": 1.5}, False),
    ({"city": "Paris", "days": 1, "unit": "kelvin"}, False),
])
def test_forced_call_grammar_takes_exactly_the_schemas_calls(args, accepted):
    grammar = xgrammar.Grammar.from_ebnf(tool_call_grammar(TOOLS, "get_weather", parallel=False))
    assert grammar_accepts(grammar, render_tool_call("get_weather", args)) == accepted


def test_required_grammar_takes_one_or_more_calls_of_any_tool():
    grammar = xgrammar.Grammar.from_ebnf(tool_call_grammar(TOOLS))
    one, other = render_tool_call("search", {"query": "q", "tags": ["a"]}), render_tool_call("get_weather", {
        "city": "c", "days": 0})
    assert grammar_accepts(grammar, one) and grammar_accepts(grammar, one + other)
    assert not grammar_accepts(grammar, "") and not grammar_accepts(grammar, "text" + one)
    single = xgrammar.Grammar.from_ebnf(tool_call_grammar(TOOLS, parallel=False))
    assert not grammar_accepts(single, one + other)


def test_schemas_the_grammar_cannot_enforce_are_refused():
    with pytest.raises(ValueError, match=r"\$ref"):
        tool_call_grammar([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/defs/a"}}}}}])


# -- messages and output parsing -----------------------------------------------------------------------------------
def test_template_messages_carry_call_arguments_as_objects_and_name_tool_results():
    messages = [ChatMessage(role="assistant", tool_calls=[{"id": "c1", "function": {
        "name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}}]),
        ChatMessage(role="tool", tool_call_id="c1", content="sunny")]
    converted = template_messages([m.model_dump(exclude_none=True) for m in messages])
    assert converted[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "days": 1}
    assert converted[1]["name"] == "get_weather"


@pytest.mark.parametrize("text", [
    "plain answer",
    "<|channel>thought\nlet me think<channel|>The answer is 4.",
    'Sure.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
    '<|channel>thought\nweather?<channel|><|tool_call>call:search{query:<|"|>x<|"|>}<tool_call|>'
    '<|tool_call>call:get_weather{city:<|"|>a<|"|>,days:1}<tool_call|>',
])
@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_streamed_parsing_joins_into_the_complete_message(text, chunk):
    from atomlite.server.chat import join_deltas
    parsers = OutputParsers(reasoning=True, tools=True)
    whole = parsers.message(text)
    reader = parsers.stream()
    deltas = [d for i in range(0, len(text), chunk) for d in reader.feed(text[i:i + chunk])] + reader.finish()
    joined = join_deltas(deltas)
    for call in whole.get("tool_calls", []) + joined.get("tool_calls", []):
        call["id"] = "same"
    assert joined == whole


# -- through the server --------------------------------------------------------------------------------------------
def test_named_tool_choice_always_calls_it_with_arguments_that_validate(client):
    for prompt in PROMPTS:
        out = chat(client, prompt, tools=TOOLS, max_tokens=250,
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
            assert call.id and call.type == "function"


def test_required_tool_choice_calls_tools_whose_arguments_validate(client):
    for prompt in PROMPTS[:3]:
        out = chat(client, prompt, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
        calls = out.choices[0].message.tool_calls
        assert len(calls) == 1
        jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[calls[0].function.name])


def test_agent_loop_call_then_result_then_answer(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, temperature=0,
                                           max_tokens=200, tool_choice={"type": "function",
                                                                        "function": {"name": "get_weather"}})
    assert first.choices[0].finish_reason == "tool_calls", first.choices[0].message  # a whole call to answer
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    answer = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, temperature=0,
                                            max_tokens=20, tool_choice="none")
    assert answer.choices[0].message.tool_calls is None
    assert isinstance(answer.choices[0].message.content, str)
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + len("sunny, 21 C")


def _streamed_message(client, **kw) -> dict:
    stream = client.chat.completions.create(model=NAME, stream=True, temperature=0, **kw)
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"name": "", "arguments": ""})
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return {"content": content or None, "reasoning": reasoning or None,
            "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def _whole_message(out) -> dict:
    message = out.choices[0].message
    return {"content": message.content or None, "reasoning": getattr(message, "reasoning_content", None),
            "calls": [{"name": c.function.name, "arguments": c.function.arguments}
                      for c in message.tool_calls or []], "finish": out.choices[0].finish_reason}


def test_streamed_tool_calls_join_into_the_whole_answer(client):
    kw = dict(messages=[{"role": "user", "content": PROMPTS[0]}], tools=TOOLS, max_tokens=120,
              tool_choice="required", parallel_tool_calls=False)
    whole = _whole_message(client.chat.completions.create(model=NAME, temperature=0, **kw))
    assert whole["calls"] and whole["finish"] == "tool_calls"
    assert _streamed_message(client, **kw) == whole


def test_thinking_goes_to_reasoning_content_whole_and_streamed(client):
    # the demo does not think on its own: a regex makes it write a thought channel, then an answer
    forced = {"regex": "<\\|channel>thought\n[a-z ]{3,12}<channel\\|>[a-z ]{1,12}"}
    kw = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=60, extra_body={"structured_outputs": forced})
    whole = _whole_message(client.chat.completions.create(model=NAME, temperature=0, **kw))
    assert whole["reasoning"] and whole["content"] and "<|channel>" not in whole["content"] + whole["reasoning"]
    assert _streamed_message(client, **kw) == whole


def test_chat_template_kwargs_reach_the_template(client):
    plain = chat(client, "hi", max_tokens=1)
    thinking = chat(client, "hi", max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    # the demo's template adds a system turn: <start_of_turn>, "system\n<|think|>" by character, <end_of_turn>, "\n"
    assert thinking.usage.prompt_tokens == plain.usage.prompt_tokens + 1 + len("system\n<|think|>") + 1 + 1


def test_tool_choice_none_leaves_markup_alone_and_auto_reads_calls(client):
    out = chat(client, "hi", tools=TOOLS, tool_choice="none", max_tokens=5)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")
    auto = chat(client, "hi", tools=TOOLS, max_tokens=5)
    assert auto.choices[0].message.tool_calls is None  # the demo writes no call on its own


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
     "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, None),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, None),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "search", "arguments": "not json"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}}}],
      "tool_choice": "required"}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"tools": []}},
     "chat_template_kwargs"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    if "image_url" in json.dumps(body):  # the demo takes images, but fetches none from the web unless allowed
        assert "--allowed-media-domains is not set" in error["message"]


def test_tools_without_a_tool_call_parser_are_a_400():
    engine = LLM(str(demo_model_dir()), device="cpu", max_model_len=2048).engine  # `server` runs the module's
    with running(make_app(engine, NAME, chat_options=ChatOptions(tool_call_parser="none"))) as base:
        r = httpx.post(f"{base}/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}, timeout=30)
        assert r.status_code == 400 and "tool-call-parser" in r.json()["error"]["message"]
        plain = httpx.post(f"{base}/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, timeout=30)
        assert plain.status_code == 200


def test_offline_chat_renders_like_the_server_and_generates_the_same(client):
    llm = LLM(str(demo_model_dir()), device="cpu", max_model_len=2048)
    messages = [{"role": "user", "content": "hi"}]
    conversation = [messages, messages + [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": (
        "function"), "function": {"name": "search", "arguments": '{"query": "x"}'}}]}, {"role": "tool",
        "tool_call_id": "c1", "content": "found"}]]
    offline = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=8), tools=TOOLS)
    served = chat(client, "hi", max_tokens=8, tools=TOOLS, tool_choice="none")
    assert offline[0].outputs[0].text == served.choices[0].message.content
    assert len(offline[1].prompt_token_ids) > len(offline[0].prompt_token_ids) + len("found")
    with pytest.raises(ValueError, match="arguments is not JSON"):
        llm.chat(messages + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}])


def test_an_earlier_answer_echoed_back_with_openai_fields_is_taken(client, server):
    """Clients send earlier answers back as the API gave them (refusal, annotations, function_call: null)."""
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "refusal": "I cannot.", "annotations": [], "audio": None,
                "function_call": None, "tool_calls": None},
               {"role": "user", "content": "ok"}]
    out = client.chat.completions.create(model=NAME, messages=history, max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": NAME, "max_tokens": 2, "messages": [
        {"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}]}, timeout=30)
    assert r.status_code == 400 and "function_call" in r.json()["error"]["message"]
