"""Gemma 4 tool-call and reasoning parsers against the reference parsers' test cases, ported as data.

Every case runs through the complete parser (checked against the expected values) and through the streaming
parser in several chunkings (one character at a time, tokenizer-like pieces with the markers whole, threes,
and the reference's own chunks where it gives them); the stream's deltas must join into the complete result.

Sources of the cases (inputs and expected outputs copied as data):
  VT  vllm-project/vllm tests/tool_parsers/test_gemma4_tool_parser.py
  VU  vllm-project/vllm tests/tool_parsers/test_gemma4_utils.py
  VB  vllm-project/vllm tests/tool_parsers/test_gemma4_regex_and_bare_calls.py (only the `<|tool_call>` forms;
      bare `call:name{...}` without the start token is an offline-only fallback there, not parsed here)
  VR  vllm-project/vllm tests/reasoning/test_gemma4_reasoning_parser.py
  VRT vllm-project/vllm tests/reasoning/test_gemma4_reasoning_with_tool_call.py
  ST  sgl-project/sglang test .../test_gemma4_detector.py (TestGemma4Detector, function_call) and its finish()
      flush test
  SR  sgl-project/sglang test .../test_reasoning_parser.py (TestGemma4Detector, reasoning)
Where our expected value differs from the reference's, a comment on the case says why.
"""
import itertools
import json
import re

import pytest

from atomlite.server.parsers.gemma4_reasoning import (
    Gemma4ReasoningStream,
    join_reasoning_deltas,
    parse_reasoning,
)
from atomlite.server.parsers.gemma4_tools import (
    Gemma4ArgsToJson,
    Gemma4ToolCallStream,
    gemma4_args_to_json,
    join_tool_call_deltas,
    parse_tool_calls,
    render_tool_call,
)

Q = '<|"|>'
START, END = "<|tool_call>", "<tool_call|>"
_MARKERS = re.compile(r'(<\|tool_call>|<tool_call\|>|<\|"\|>|<\|channel>|<channel\|>)')


def token_like_pieces(text: str) -> list[str]:
    pieces = []
    for part in _MARKERS.split(text):
        pieces += [part] if _MARKERS.fullmatch(part) else re.findall(r"\s*\S+|\s+", part)
    return pieces


def chunkings(text: str, given: list[str] | None = None) -> list[list[str]]:
    ways = [[text], list(text), token_like_pieces(text), [text[i:i + 3] for i in range(0, len(text), 3)]]
    return ways + ([given] if given else [])


def counting_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


# -- argument notation -> JSON ---------------------------------------------------------------------------------
# (Gemma 4 argument text after `call:name{`, expected arguments)
ARG_CASES = [
    # VT TestParseGemma4Args
    ("", {}),
    ("   ", {}),
    (f"location:{Q}Paris{Q}", {"location": "Paris"}),
    (f"location:{Q}Paris, France{Q}", {"location": "Paris, France"}),
    (f"location:{Q}San Francisco{Q},unit:{Q}celsius{Q}", {"location": "San Francisco", "unit": "celsius"}),
    ("count:42", {"count": 42}),
    ("score:3.14", {"score": 3.14}),
    ("flag:true", {"flag": True}),
    ("flag:false", {"flag": False}),
    ("param:null", {"param": None}),
    (f"name:{Q}test{Q},count:42,active:true,score:3.14", {"name": "test", "count": 42, "active": True, "score": 3.14}),
    (f"nested:{{inner:{Q}value{Q}}}", {"nested": {"inner": "value"}}),
    (f"record_map:{{{Q}3{Q}:{Q}new text{Q}}}", {"record_map": {"3": "new text"}}),
    (f"outer:{{inner:{{{Q}3{Q}:{Q}new text{Q}}}}}", {"outer": {"inner": {"3": "new text"}}}),
    (f"items:[{Q}a{Q},{Q}b{Q}]", {"items": ["a", "b"]}),
    (f"key:{Q}unterminated", {"key": "unterminated"}),
    ("key:", {"key": ""}),
    # VT partial-mode cases: here the streamed pieces are final by construction, so the chunked runs below check
    # what vLLM's partial mode guards (a trailing "108." or "tru" never goes out early).
    ("left:108.,right:22.8", {"left": 108.0, "right": 22.8}),
    (f"name:{Q}test{Q},flag:", {"name": "test", "flag": ""}),
    (":[t:[]", {"": ["t:["]}),  # VT malformed partial array: must end and give an object
    # VT TestParseGemma4Array, wrapped as the value of `items`
    (f"items:[{Q}a{Q},{Q}b{Q}]", {"items": ["a", "b"]}),
    ("items:[]", {"items": []}),
    ("items:[42,true,3.14]", {"items": [42, True, 3.14]}),
    (f"items:[[{Q}a]b{Q},{Q}c{Q}],{Q}tail{Q}]", {"items": [["a]b", "c"], "tail"]}),
    ("items:[42,]trailing]", {"items": [42]}),
    ("items:[108.,22.8]", {"items": [108.0, 22.8]}),
    # VU TestParseToolArguments
    (f'content:{Q}She said "hello" loudly{Q}', {"content": 'She said "hello" loudly'}),
    (f'path:{Q}out.html{Q},content:{Q}<div class="main">hello</div>{Q}',
     {"path": "out.html", "content": '<div class="main">hello</div>'}),
    (f"content:{Q}<html><div>{{test}}</div></html>{Q}", {"content": "<html><div>{test}</div></html>"}),
    (f'code:{Q}function() {{ return "ok"; }}{Q}', {"code": 'function() { return "ok"; }'}),
    (f"content:{Q}line1\nline2\nline3{Q}", {"content": "line1\nline2\nline3"}),
    # ST argument helpers
    ("flag:true,other:false", {"flag": True, "other": False}),
    (f"url:{Q}http://example.com{Q}", {"url": "http://example.com"}),
    (f"outer:{{inner:{Q}val{Q},num:5}}", {"outer": {"inner": "val", "num": 5}}),
    (f"items:[{Q}hello{Q}, 42, true, {{key:{Q}val{Q}}}]", {"items": ["hello", 42, True, {"key": "val"}]}),
    ("v:hello", {"v": "hello"}),
]


@pytest.mark.parametrize("args, expected", ARG_CASES)
def test_gemma_arguments_become_the_reference_json(args, expected):
    assert json.loads(gemma4_args_to_json(args)) == expected


@pytest.mark.parametrize("args, expected", ARG_CASES)
def test_argument_pieces_of_any_chunking_join_into_the_whole_json(args, expected):
    whole = gemma4_args_to_json(args)
    for chunks in chunkings(args):
        converter = Gemma4ArgsToJson()
        pieces = [converter.feed(chunk) for chunk in chunks] + [converter.feed("", final=True)]
        assert "".join(pieces) == whole


# -- tool calls ------------------------------------------------------------------------------------------------
def call(name: str, arguments: dict) -> tuple[str, dict]:
    return name, arguments


WEATHER_LONDON = f"{START}call:get_weather{{location:{Q}London{Q}}}{END}"

# (id, model output, expected content, expected calls, the reference's own chunks or None)
TOOL_CASES = [
    # VT TestExtractToolCalls
    ("no_tool_calls", "Hello, how can I help you today?", "Hello, how can I help you today?", [], None),
    ("single", WEATHER_LONDON, None, [call("get_weather", {"location": "London"})], None),
    ("multiple_arguments", f"{START}call:get_weather{{location:{Q}San Francisco{Q},unit:{Q}celsius{Q}}}{END}", None,
     [call("get_weather", {"location": "San Francisco", "unit": "celsius"})], None),
    ("text_before", f"Let me check the weather for you. {START}call:get_weather{{location:{Q}Paris{Q}}}{END}",
     "Let me check the weather for you.", [call("get_weather", {"location": "Paris"})], None),
    ("two_calls", WEATHER_LONDON + f"{START}call:get_time{{location:{Q}London{Q}}}{END}", None,
     [call("get_weather", {"location": "London"}), call("get_time", {"location": "London"})], None),
    ("nested", f"{START}call:complex_function{{nested:{{inner:{Q}value{Q}}},list:[{Q}a{Q},{Q}b{Q}]}}{END}", None,
     [call("complex_function", {"nested": {"inner": "value"}, "list": ["a", "b"]})], None),
    ("number_and_boolean", f"{START}call:set_status{{is_active:true,count:42,score:3.14}}{END}", None,
     [call("set_status", {"is_active": True, "count": 42, "score": 3.14})], None),
    ("hyphenated_name", f"{START}call:get-weather{{location:{Q}London{Q}}}{END}", None,
     [call("get-weather", {"location": "London"})], None),
    ("dotted_name", f"{START}call:weather.get{{location:{Q}London{Q}}}{END}", None,
     [call("weather.get", {"location": "London"})], None),
    ("no_arguments", f"{START}call:get_status{{}}{END}", None, [call("get_status", {})], None),
    # VT TestStreamingExtraction (their chunks)
    ("stream_basic", f"{START}call:get_weather{{location:{Q}Paris, France{Q}}}{END}", None,
     [call("get_weather", {"location": "Paris, France"})],
     [START, "call:get_weather{", f"location:{Q}Paris", ", France", f"{Q}}}", END]),
    ("stream_multi_arg", f"{START}call:get_weather{{location:{Q}Tokyo{Q},unit:{Q}celsius{Q}}}{END}", None,
     [call("get_weather", {"location": "Tokyo", "unit": "celsius"})],
     [START, "call:get_weather{", f"location:{Q}Tokyo{Q},", f"unit:{Q}celsius{Q}}}", END]),
    ("stream_text_before", f"Let me check the weather. {WEATHER_LONDON}", "Let me check the weather.",
     [call("get_weather", {"location": "London"})],
     ["Let me check ", "the weather. ", START, "call:get_weather{", f"location:{Q}London{Q}}}", END]),
    ("stream_numeric", f"{START}call:set_config{{count:42,active:true}}{END}", None,
     [call("set_config", {"count": 42, "active": True})],
     [START, "call:set_config{", "count:42,", "active:true}", END]),
    ("stream_true_split", f"{START}call:search{{input:{{all:true}}}}{END}", None,
     [call("search", {"input": {"all": True}})], [START, "call:search{input:{all:tru", "e}}", END]),
    ("stream_false_split", f"{START}call:set{{flag:false}}{END}", None,
     [call("set", {"flag": False})], [START, "call:set{flag:fals", "e}", END]),
    ("stream_number_split", f"{START}call:set{{count:42}}{END}", None,
     [call("set", {"count": 42})], [START, "call:set{count:4", "2}", END]),
    ("stream_empty_args", f"{START}call:get_status{{}}{END}", None, [call("get_status", {})],
     [START, "call:get_status{}", END]),
    ("stream_split_delimiter", f"{START}call:todowrite{{content:{Q}Buy milk{Q}}}{END}", None,
     [call("todowrite", {"content": "Buy milk"})],
     [START, "call:todowrite{", f"content:{Q}Buy milk<|", '"|>}', END]),
    ("stream_text_after_call", f"{START}call:get_weather{{location:{Q}Paris{Q}}}{END}<div>", "<div>",
     [call("get_weather", {"location": "Paris"})],
     [START, "call:get_weather{", f"location:{Q}Paris{Q}}}", f"{END}<", "div>"]),
    ("stream_html_argument",
     f'{START}call:write_file{{path:{Q}index.html{Q},content:{Q}<!DOCTYPE html>\n<html lang="zh-CN">\n<head>\n'
     f'    <meta charset="UTF-8">\n    <meta name="viewport" content="width=device-width">\n{Q}}}{END}', None,
     [call("write_file", {"path": "index.html", "content": '<!DOCTYPE html>\n<html lang="zh-CN">\n<head>\n'
                          '    <meta charset="UTF-8">\n    <meta name="viewport" content="width=device-width">\n'})],
     [START, "call:write_file{", f"path:{Q}index.html{Q},", f"content:{Q}<!DOCTYPE html>\n<",
      'html lang="zh-CN">\n<', "head>\n    <", 'meta charset="UTF-8">\n    <',
      'meta name="viewport" content="width=device-width">\n', f"{Q}}}", END]),
    ("stream_trailing_bool",
     f"{START}call:Edit{{file_path:{Q}src/env.py{Q},old_string:{Q}old_val{Q},new_string:{Q}new_val{Q},"
     f"replace_all:false}}{END}", None,
     [call("Edit", {"file_path": "src/env.py", "old_string": "old_val", "new_string": "new_val",
                    "replace_all": False})],
     [START, "call:Edit{", f"file_path:{Q}src/env.py{Q},", f"old_string:{Q}old_val{Q},",
      f"new_string:{Q}new_val{Q},", "replace_all:", "false}", END]),
    # VU TestParseToolCalls
    ("internal_quotes", f'{START}call:write_file{{path:{Q}index.html{Q},content:{Q}<div class="app">Hello</div>{Q}}}'
     f"{END}", None, [call("write_file", {"path": "index.html", "content": '<div class="app">Hello</div>'})], None),
    ("two_reads", f"{START}call:read_file{{path:{Q}a.txt{Q}}}{END}{START}call:read_file{{path:{Q}b.txt{Q}}}{END}",
     None, [call("read_file", {"path": "a.txt"}), call("read_file", {"path": "b.txt"})], None),
    # VB canonical forms
    ("bash", f"{START}call:bash{{command:{Q}ls -la /work{Q}}}{END}", None,
     [call("bash", {"command": "ls -la /work"})], None),
    ("closed_by_turn_end", f"{START}call:gdb{{args:{Q}-batch -ex run /tmp/poc{Q}}}<turn|>", None,
     [call("gdb", {"args": "-batch -ex run /tmp/poc"})], None),
    ("newline_between_calls", f"{START}call:read_file{{path:{Q}/work/Makefile{Q}}}{END}\n"
     f"{START}call:bash{{command:{Q}make -j8{Q}}}{END}", None,
     [call("read_file", {"path": "/work/Makefile"}), call("bash", {"command": "make -j8"})], None),
    ("colon_after_start", f"{START}:call:bash{{command:{Q}pytest{Q}}}", None, [call("bash", {"command": "pytest"})],
     None),
    # ST TestGemma4Detector. SGLang keeps the space before a call ("Some text before ") and, in its complete
    # parser, drops text after the first call; here whitespace touching a call goes, other text stays.
    ("sglang_text_before", f"Some text before {START}call:get_weather{{location:{Q}Tokyo{Q}}}{END}",
     "Some text before", [call("get_weather", {"location": "Tokyo"})], None),
    ("sglang_stream_text_around", f"Some text before {START}call:get_weather{{location:{Q}Tokyo{Q}}}{END} after",
     "Some text before after", [call("get_weather", {"location": "Tokyo"})],
     ["Some text ", "before <|tool", "_call>call:get_we", "ather{location:<|", f'"|>Tokyo{Q}}}<tool_', "call|> after"]),
    ("sglang_nested_array", f"{START}call:get_weather{{location:{Q}New York{Q},nested:[1, 2, {{inner:{Q}val{Q}}}]}}"
     f"{END}", None, [call("get_weather", {"location": "New York", "nested": [1, 2, {"inner": "val"}]})],
     [f'{START}call:get_weather{{location:<|"', f'|>New York{Q},nested:[1, 2, {{inner:{Q}', f"val{Q}}}]}}{END}"]),
    ("sglang_no_call", "This is plain text without any tool calls.", "This is plain text without any tool calls.",
     [], None),
    ("sglang_unknown_function", f"{START}call:unknown_func{{arg:{Q}val{Q}}}{END}", None,
     [call("unknown_func", {"arg": "val"})], None),
    ("sglang_nested_object", f"{START}call:get_weather{{location:{Q}Tokyo{Q},details:{{temp:25,unit:{Q}celsius{Q}}}}}"
     f"{END}", None, [call("get_weather", {"location": "Tokyo", "details": {"temp": 25, "unit": "celsius"}})], None),
    ("sglang_text_between", f"Some text {START}call:get_weather{{location:{Q}Tokyo{Q}}}{END} more text "
     f"{START}call:get_time{{timezone:{Q}UTC{Q}}}{END}", "Some text more text",
     [call("get_weather", {"location": "Tokyo"}), call("get_time", {"timezone": "UTC"})], None),
    ("sglang_stream_two_calls", f"{START}call:get_weather{{location:{Q}Tokyo{Q}}}{END} "
     f"{START}call:get_time{{timezone:{Q}UTC{Q}}}{END}", None,
     [call("get_weather", {"location": "Tokyo"}), call("get_time", {"timezone": "UTC"})],
     [f"{START}call:get_weather{{location:{Q}", f"Tokyo{Q}}}{END}", f" {START}call:get_time{{timezone:{Q}",
      f"UTC{Q}}}{END}"]),
    ("sglang_stream_empty_args", f"{START}call:get_weather{{}}{END}", None, [call("get_weather", {})],
     [f"{START}call:get_weather{{}}", END]),
    ("sglang_stream_text_between", f"Hello! {START}call:get_weather{{location:{Q}Paris{Q}}}{END} Let me also check "
     f"{START}call:get_time{{timezone:{Q}UTC{Q}}}{END}", "Hello! Let me also check",
     [call("get_weather", {"location": "Paris"}), call("get_time", {"timezone": "UTC"})],
     ["Hello! ", f"{START}call:get_weather{{location:{Q}Paris{Q}}}{END}", " Let me also check ",
      f"{START}call:get_time{{timezone:{Q}UTC{Q}}}{END}"]),
    ("sglang_end_marker_inside_string", f"{START}call:get_weather{{city:{Q}Beijing{END}", None,
     [call("get_weather", {"city": "Beijing"})], None),
    ("sglang_single_quoted_bare", f"{START}call:get_weather{{city: 'Paris'}}{END}", None,
     [call("get_weather", {"city": "'Paris'"})], None),
    # ours: whitespace touching a call goes (before the first, after the last); plain output stays untouched
    ("whitespace_around_calls", f"\n {WEATHER_LONDON}\n\nDone. ", "Done.",
     [call("get_weather", {"location": "London"})], None),
    ("plain_text_verbatim", "  Hello,\n world!  \n", "  Hello,\n world!  \n", [], None),
    ("cut_off_before_the_brace", f"Let me look. {START}call:get_wea", f"Let me look. {START}call:get_wea", [], None),
]


def stream_tool_deltas(chunks: list[str]) -> list[dict]:
    stream = Gemma4ToolCallStream(new_id=counting_ids())
    return [delta for chunk in chunks for delta in stream.feed(chunk)] + stream.finish()


def assert_openai_tool_delta_shapes(deltas: list[dict]) -> None:
    started = set()
    for delta in deltas:
        assert len(delta) == 1 and (delta.get("content") or delta.get("tool_calls")), delta
        for part in delta.get("tool_calls", []):
            if part["index"] not in started:
                assert part["index"] == len(started), "calls must open in order"
                assert part["id"] and part["type"] == "function" and part["function"]["name"]
                assert part["function"]["arguments"] == "", "the name goes out alone, before the arguments"
                started.add(part["index"])
            else:
                assert set(part) == {"index", "function"} and set(part["function"]) == {"arguments"}
                assert part["function"]["arguments"]


@pytest.mark.parametrize("text, content, calls, chunks",
                         [pytest.param(*case[1:], id=case[0]) for case in TOOL_CASES])
def test_tool_calls_match_the_reference(text, content, calls, chunks):
    result = parse_tool_calls(text)
    assert result.content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in result.tool_calls)


@pytest.mark.parametrize("text, content, calls, chunks",
                         [pytest.param(*case[1:], id=case[0]) for case in TOOL_CASES])
def test_streamed_tool_calls_join_into_the_complete_result(text, content, calls, chunks):
    complete = parse_tool_calls(text, new_id=counting_ids())
    for way in chunkings(text, chunks):
        deltas = stream_tool_deltas(way)
        assert_openai_tool_delta_shapes(deltas)
        assert join_tool_call_deltas(deltas) == complete, way


# VT expects no call and the raw text as content, and SGLang gives the cut-off call back as text. A stream has sent
# the name by then, so to keep stream and complete result equal a call cut off by the end of the output stays a
# call, its arguments as far as they were written (never closed into arguments the model did not write).
CUT_CASES = [
    (f"{START}call:get_weather{{location:{Q}London", '{"location": "London'),
    (f"hi {START}call:get_weather{{city:", '{"city": '),
    (f"{START}call:get_weather{{", "{"),
    (f"{START}call:f{{a:12", '{"a": 12'),
    (f"{START}call:f{{a:{Q}x{Q},bc", '{"a": "x", "bc'),
]


@pytest.mark.parametrize("text, arguments", CUT_CASES)
def test_a_call_cut_off_keeps_its_arguments_as_written(text, arguments):
    complete = parse_tool_calls(text, new_id=counting_ids())
    assert [c["function"]["arguments"] for c in complete.tool_calls] == [arguments]
    for way in chunkings(text, None):
        assert join_tool_call_deltas(stream_tool_deltas(way)) == complete, way


def test_string_arguments_stream_before_the_call_ends():
    text = f"{START}call:write{{content:{Q}" + "x" * 40 + f"{Q}}}{END}"
    stream = Gemma4ToolCallStream()
    deltas = [d for char in text[:-len(f"{Q}}}{END}")] for d in stream.feed(char)]
    sent = "".join(p["function"].get("arguments", "") for d in deltas for p in d.get("tool_calls", []))
    assert sent == '{"content": "' + "x" * 40


def test_a_bare_value_waits_for_its_end():
    stream = Gemma4ToolCallStream()
    deltas = stream.feed(f"{START}call:set{{flag:tru")
    sent = "".join(p["function"].get("arguments", "") for d in deltas for p in d.get("tool_calls", []))
    assert sent == '{"flag": '


@pytest.mark.parametrize("arguments", [
    {"location": "London", "unit": "celsius"},
    {"path": "a b, c", "n": 3, "f": 2.5, "ok": True, "no": False, "nothing": None},
    {"items": ["x", 1, {"k": "v", "deep": [[True], []]}], "empty": {}, "text": 'say "hi" {now}\n'},
])
def test_rendered_calls_parse_back_to_their_arguments(arguments):
    result = parse_tool_calls(render_tool_call("tool.name-1", arguments))
    assert result.content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls] == [
        ("tool.name-1", arguments)]


def test_rendered_call_is_the_chat_template_form():
    assert render_tool_call("get_weather", {"unit": "celsius", "location": "London"}) == (
        f"{START}call:get_weather{{location:{Q}London{Q},unit:{Q}celsius{Q}}}{END}")


# -- reasoning -------------------------------------------------------------------------------------------------
# (id, model output, expected reasoning, expected content, prompt opened the channel, reference's chunks)
REASONING_CASES = [
    # VR: without a channel start, vLLM's complete parser takes text before <channel|> as reasoning while its
    # streaming parser gives it all as content. Here both follow the stream unless the prompt opened the
    # channel (started_in_thinking, SGLang's force_reasoning), where both follow vLLM's complete parser.
    ("invalid_simple", "This is a reasoning section<channel|>This is the rest",
     "This is a reasoning section", "This is the rest", True, None),
    ("invalid_simple_streaming", "This is a reasoning section<channel|>This is the rest",
     None, "This is a reasoning sectionThis is the rest", False, None),
    ("invalid_complete", "This is a reasoning section<channel|>", "This is a reasoning section", None, True, None),
    ("invalid_complete_streaming", "This is a reasoning section<channel|>", None, "This is a reasoning section",
     False, None),
    ("no_content", "<|channel>This is reasoning", "This is reasoning", None, False, None),
    ("no_reasoning", "This is content", None, "This is content", False, None),
    ("reasoning", "<|channel>This is a reasoning section<channel|>This is the rest",
     "This is a reasoning section", "This is the rest", False, None),
    ("complete_reasoning", "<|channel>This is a reasoning section<channel|>", "This is a reasoning section", None,
     False, None),
    ("multiple_lines", "<|channel>This\nThat<channel|>This is the rest\nThat", "This\nThat",
     "This is the rest\nThat", False, None),
    ("no_end", "<|channel>This is a reasoning section", "This is a reasoning section", None, False, None),
    ("empty", "", None, None, False, None),
    ("new_line", "Before\n<|channel>This is a reasoning section<channel|>\nThis is the rest",
     "This is a reasoning section", "Before\n\nThis is the rest", False, None),
    ("thought_prefix", "<|channel>thought\nActual reasoning here<channel|>Final answer", "Actual reasoning here",
     "Final answer", False, None),
    ("thought_prefix_only", "<|channel>thought\n<channel|>", None, None, False, None),
    ("thought_prefix_multiline", "<|channel>thought\nLine1\nLine2<channel|>Answer", "Line1\nLine2", "Answer",
     False, None),
    ("thought_prefix_diverge", "<|channel>thousand reasons<channel|>Done", "thousand reasons", "Done", False, None),
    ("tool_call_started", "<|tool_call>", None, "<|tool_call>", False, None),
    # SR TestGemma4Detector and integration scenarios
    ("sglang_complete", "<|channel>thought\nLet me think about this<channel|>The answer is 42.",
     "Let me think about this", "The answer is 42.", False, None),
    ("sglang_without_thinking", "Direct answer without thinking.", None, "Direct answer without thinking.", False,
     None),
    ("sglang_reasoning_only", "<|channel>thought\nStill thinking...", "Still thinking...", None, False, None),
    ("sglang_force_reasoning", "This should be reasoning<channel|>The answer.", "This should be reasoning",
     "The answer.", True, None),
    ("sglang_stream_flow", "<|channel>thought\nreasoning content<channel|>final answer", "reasoning content",
     "final answer", False, ["<|channel>", "thought\nreasoning content", "<channel|>", "final answer"]),
    ("sglang_split_end", "<|channel>thought\nreasoning content<channel|>final answer", "reasoning content",
     "final answer", False, ["<|channel>thought\n", "reasoning content", "<chan", "nel|>final answer"]),
    ("sglang_label_split", "<|channel>thought\nreasoning here", "reasoning here", None, False,
     ["<|channel>", "thought\n", "reasoning here"]),
    ("sglang_small_chunks", "<|channel>thought\nThinking step by step.", "Thinking step by step.", None, False,
     ["<|channel>thought\n", "Think", "ing ", "step ", "by ", "step."]),
    ("sglang_end_mid_chunk", "<|channel>thought\nsome reasoning<channel|>the answer", "some reasoning",
     "the answer", False, ["<|channel>thought\n", "some reasoning<channel|>the answer"]),
    ("sglang_force_reasoning_stream", "reasoning content<channel|>the answer", "reasoning content", "the answer",
     True, ["reasoning content", "<channel|>the answer"]),
    ("sglang_math", "<|channel>thought\nI need to solve x + 2 = 5. Subtracting 2: x = 3.<channel|>The answer is "
     "x = 3.", "I need to solve x + 2 = 5. Subtracting 2: x = 3.", "The answer is x = 3.", False, None),
    # ours: a tool call inside an unterminated channel ends it (vLLM's is_reasoning_end does the same on ids)
    ("tool_call_ends_open_channel", f"<|channel>thought\nI'll look it up{WEATHER_LONDON}", "I'll look it up",
     WEATHER_LONDON, False, None),
]


def stream_reasoning_deltas(chunks: list[str], started_in_thinking: bool) -> list[dict]:
    stream = Gemma4ReasoningStream(started_in_thinking)
    return [delta for chunk in chunks for delta in stream.feed(chunk)] + stream.finish()


@pytest.mark.parametrize("text, reasoning, content, started, chunks",
                         [pytest.param(*case[1:], id=case[0]) for case in REASONING_CASES])
def test_reasoning_matches_the_reference(text, reasoning, content, started, chunks):
    assert parse_reasoning(text, started_in_thinking=started) == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content, started, chunks",
                         [pytest.param(*case[1:], id=case[0]) for case in REASONING_CASES])
def test_streamed_reasoning_joins_into_the_complete_result(text, reasoning, content, started, chunks):
    for way in chunkings(text, chunks):
        deltas = stream_reasoning_deltas(way, started)
        assert all(len(d) == 1 and next(iter(d.values())) for d in deltas), deltas
        assert join_reasoning_deltas(deltas) == (reasoning, content), way


def test_the_thought_label_is_held_until_it_can_be_told_apart():
    stream = Gemma4ReasoningStream()
    assert stream.feed("<|channel>thou") == []
    assert stream.feed("sand") == [{"reasoning_content": "thousand"}]


# -- reasoning then tool calls, as the server chains them (VRT) ----------------------------------------------------
def stream_reasoning_then_tools(chunks: list[str]) -> tuple[str | None, object]:
    reasoning_stream, tool_stream = Gemma4ReasoningStream(), Gemma4ToolCallStream(new_id=counting_ids())
    reasoning_deltas, tool_deltas = [], []
    for delta in [d for chunk in chunks for d in reasoning_stream.feed(chunk)] + reasoning_stream.finish():
        if "content" in delta:
            tool_deltas += tool_stream.feed(delta["content"])
        else:
            reasoning_deltas.append(delta)
    tool_deltas += tool_stream.finish()
    return join_reasoning_deltas(reasoning_deltas)[0], join_tool_call_deltas(tool_deltas)


@pytest.mark.parametrize("tokens, reasoning, content, calls", [
    (["<|channel>", "thought", "\n", "I", " need", " to", " find", " files", "<channel|>", "<|tool_call>", "call",
      ":", "find", "{", "path", ":", Q, "research", Q, "}", "<tool_call|>"],
     "I need to find files", None, [("find", {"path": "research"})]),
    (["<|channel>", "thought", "\n", "Let", " me", " think", "<channel|>", "The", " answer", " is", " 42"],
     "Let me think", "The answer is 42", []),
    (["<|channel>", "thought", "\n", "I", " need", " to", " answer", "<channel|>", "The", " answer", " is", " 42"],
     "I need to answer", "The answer is 42", []),
])
def test_reasoning_then_tool_calls_streamed_or_whole(tokens, reasoning, content, calls):
    for way in (tokens, ["".join(tokens)], list("".join(tokens))):
        got_reasoning, result = stream_reasoning_then_tools(way)
        assert got_reasoning == reasoning
        assert result.content == content
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls] == calls
