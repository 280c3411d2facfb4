"""Gemma 4 tool calls in the model's output -> OpenAI `tool_calls` (complete and streaming).

The model writes `<|tool_call>call:NAME{ARGS}<tool_call|>`, several calls back to back. ARGS is Gemma 4's own
notation, not JSON: bare keys, strings between `<|"|>` delimiters, bare numbers, true/false/null, nested {...}
and [...]. Tool declarations, earlier calls and tool responses reach the prompt only through the model's chat
template (`apply_chat_template(messages, tools=...)`); nothing here renders a prompt.
"""
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from atomlite.server.parsers import DeltaStream, partial_marker_len, split_at_marker

TOOL_CALL_START = "<|tool_call>"
TOOL_CALL_END = "<tool_call|>"
CALL_PREFIX = "call:"
STRING_DELIM = '<|"|>'
# In the prompt only (written by the chat template), listed so the server and grammars can name them.
TOOL_DECLARATION_START = "<|tool>"
TOOL_DECLARATION_END = "<tool|>"
TOOL_RESPONSE_START = "<|tool_response>"
TOOL_RESPONSE_END = "<tool_response|>"

_SPACE = " \t\r\n"


def make_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def render_tool_call(name: str, arguments: dict) -> str:
    """A call as the model writes it (keys sorted, as the chat template writes them): the shape a grammar for a
    forced call must produce."""
    body = ",".join(f"{key}:{render_value(arguments[key])}" for key in sorted(arguments))
    return f"{TOOL_CALL_START}{CALL_PREFIX}{name}{{{body}}}{TOOL_CALL_END}"


def render_value(value) -> str:
    if isinstance(value, str):
        return STRING_DELIM + value + STRING_DELIM
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{render_value(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render_value(item) for item in value) + "]"
    return str(value)


def gemma4_args_to_json(args: str) -> str:
    """The JSON object for the Gemma 4 argument text that follows `call:NAME{` (its closing `}` optional)."""
    return Gemma4ArgsToJson().feed(args, final=True)


class Gemma4ArgsToJson:
    """Gemma 4 argument text -> JSON text, piece by piece. A piece is never taken back (a bare value waits for
    its end, a string tail that may be half a delimiter waits for the next text), so the pieces of any chunking
    join into the same JSON."""

    def __init__(self):
        self._rest = ""
        self._closers = ["}"]  # one per open container, innermost last
        self._counts = [0]  # members already written, per open container
        self._state = "member"
        self._token = ""  # key or bare value read so far
        self._out = ["{"]

    def feed(self, text: str, final: bool = False, cut: bool = False) -> str:
        """cut: the text ended inside the arguments (the output ran out): what was read is given as it stands, its
        containers left open, rather than closed into arguments the model never wrote."""
        self._rest += text
        while self._rest and self._state != "done" and getattr(self, f"_read_{self._state}")(final):
            pass
        if final and self._state != "done":
            self._give_partial() if cut else self._close_everything()
        piece, self._out = "".join(self._out), []
        return piece

    # -- one reader per state; each returns False when it needs more text ---------------------------------------
    def _read_member(self, final: bool) -> bool:
        char = self._rest[0]
        if char in _SPACE or char == ",":
            self._rest = self._rest[1:]
        elif char == self._closers[-1]:
            self._rest = self._rest[1:]
            self._close_container()
        elif char in "}]":  # a closer that closes nothing open: drop it
            self._rest = self._rest[1:]
        elif self._closers[-1] == "]":
            self._start_member()
            self._state = "value"
        else:
            at_delim = self._at_delim(final)
            if at_delim is None:
                return False
            self._token = ""
            self._state = "quoted_key" if at_delim else "key"
            if at_delim:
                self._rest = self._rest[len(STRING_DELIM):]
        return True

    def _read_key(self, final: bool) -> bool:
        colon = self._rest.find(":")
        if colon < 0:
            self._token, self._rest = self._token + self._rest, ""
            return False
        self._write_key((self._token + self._rest[:colon]).strip())
        self._rest = self._rest[colon + 1:]
        return True

    def _read_quoted_key(self, final: bool) -> bool:
        text, found = self._take_string(final)
        self._token += text
        if found:
            self._state = "colon"
        return found

    def _read_colon(self, final: bool) -> bool:
        colon = self._rest.find(":")
        self._rest = "" if colon < 0 else self._rest[colon + 1:]
        if colon >= 0:
            self._write_key(self._token)
        return colon >= 0

    def _read_value(self, final: bool) -> bool:
        char = self._rest[0]
        at_delim = self._at_delim(final)
        if at_delim is None:
            return False
        if at_delim:
            self._rest = self._rest[len(STRING_DELIM):]
            self._out.append('"')
            self._state = "string"
        elif char in _SPACE:
            self._rest = self._rest[1:]
        elif char in "{[":
            self._rest = self._rest[1:]
            self._open_container(char)
        elif char in ",}]":  # `key:` with nothing after it
            self._out.append('""')
            self._state = "member"
        else:
            self._token = ""
            self._state = "bare"
        return True

    def _read_string(self, final: bool) -> bool:
        text, found = self._take_string(final)
        self._out.append(_json_string_body(text) + ('"' if found else ""))
        if found:
            self._state = "member"
        return found

    def _read_bare(self, final: bool) -> bool:
        end = min((i for i in map(self._rest.find, ",}]") if i >= 0), default=-1)
        if end < 0:
            self._token, self._rest = self._token + self._rest, ""
            return False
        self._out.append(_bare_value_json(self._token + self._rest[:end]))
        self._rest = self._rest[end:]
        self._state = "member"
        return True

    # -- helpers -----------------------------------------------------------------------------------------------
    def _at_delim(self, final: bool) -> bool | None:
        """Whether the text starts with a string delimiter; None while it could still become one."""
        if self._rest.startswith(STRING_DELIM):
            return True
        if not final and STRING_DELIM.startswith(self._rest):
            return None
        return False

    def _take_string(self, final: bool) -> tuple[str, bool]:
        """String text up to its closing delimiter (consumed), and whether that delimiter was found."""
        end = self._rest.find(STRING_DELIM)
        if end >= 0:
            text, self._rest = self._rest[:end], self._rest[end + len(STRING_DELIM):]
            return text, True
        held = 0 if final else partial_marker_len(self._rest, (STRING_DELIM,))
        text, self._rest = self._rest[:len(self._rest) - held], self._rest[len(self._rest) - held:]
        return text, False

    def _start_member(self) -> None:
        self._out.append(", " if self._counts[-1] else "")
        self._counts[-1] += 1

    def _write_key(self, key: str) -> None:
        self._start_member()
        self._out.append(json.dumps(key, ensure_ascii=False) + ": ")
        self._state = "value"

    def _open_container(self, opener: str) -> None:
        self._out.append(opener)
        self._closers.append("}" if opener == "{" else "]")
        self._counts.append(0)
        self._state = "member"

    def _close_container(self) -> None:
        self._out.append(self._closers.pop())
        self._counts.pop()
        self._state = "member" if self._closers else "done"

    def _close_everything(self) -> None:
        """The text ended: finish what was being read (an unfinished key is dropped) and close what is open."""
        if self._state == "string":
            self._out.append('"')
        elif self._state == "bare":
            self._out.append(_bare_value_json(self._token))
        elif self._state == "value" and self._closers[-1] == "}":
            self._out.append('""')
        self._out.extend(reversed(self._closers))
        self._closers, self._counts, self._state = [], [], "done"


    def _give_partial(self) -> None:
        """The text ended mid-arguments: a key or bare value being read is given as far as it went."""
        if self._state in ("key", "quoted_key"):
            self._start_member()
            self._out.append('"' + _json_string_body(self._token))
        elif self._state == "bare":
            self._out.append(self._token.strip())
        self._state = "done"


def _json_string_body(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _bare_value_json(raw: str) -> str:
    raw = raw.strip()
    if raw in ("true", "false"):
        return raw
    if raw.lower() in ("null", "none", "nil"):
        return "null"
    number = _as_number(raw)
    return json.dumps(raw if number is None else number, ensure_ascii=False)


def _as_number(raw: str) -> int | float | None:
    for kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            continue
        return value if math.isfinite(value) else None
    return None


@dataclass(slots=True)
class ToolCallResult:
    content: str | None
    tool_calls: list[dict]


def parse_tool_calls(text: str, new_id: Callable[[], str] = make_tool_call_id) -> ToolCallResult:
    """Content and OpenAI tool calls ({id, type, function: {name, arguments}}) of a complete model output."""
    stream = Gemma4ToolCallStream(new_id)
    return join_tool_call_deltas(stream.feed(text) + stream.finish())


def join_tool_call_deltas(deltas: list[dict]) -> ToolCallResult:
    """What a client rebuilds from the deltas of a stream."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content") or ""
        for part in delta.get("tool_calls", []):
            call = calls.setdefault(part["index"], {"id": "", "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
            call["id"] = part.get("id", call["id"])
            call["function"]["name"] += part["function"].get("name") or ""
            call["function"]["arguments"] += part["function"].get("arguments") or ""
    return ToolCallResult(content or None, [calls[i] for i in sorted(calls)])


class Gemma4ToolCallStream(DeltaStream):
    """Fed successive text deltas, returns OpenAI deltas: {"content": ...} and {"tool_calls": [...]} with the
    name first (index, id, type, function.name) and then function.arguments pieces.

    Whitespace touching a call is dropped, except the run before a call that content follows: that one stays,
    as the separator. Output without calls passes through untouched.
    """

    def __init__(self, new_id: Callable[[], str] = make_tool_call_id):
        super().__init__()
        self._new_id = new_id
        self._state = "content"  # content | header | arguments
        self._calls = 0
        self._args: Gemma4ArgsToJson | None = None
        self._held_space = ""
        self._wrote_content = False
        self._after_call = False

    def _read(self, out: list[dict], final: bool) -> bool:
        return getattr(self, f"_read_{self._state}")(out, final)

    def _flush(self, out: list[dict]) -> None:
        if self._calls == 0 and self._held_space:
            _append_content(out, self._held_space)

    def _read_content(self, out: list[dict], final: bool) -> bool:
        text, marker, self._buffer = split_at_marker(self._buffer, (TOOL_CALL_START,), final)
        self._write_content(text, out)
        if marker:
            self._state = "header"
        return marker is not None

    def _read_header(self, out: list[dict], final: bool) -> bool:
        brace, end = self._buffer.find("{"), self._buffer.find(TOOL_CALL_END)
        if brace >= 0 and (end < 0 or brace < end):
            self._open_call(self._buffer[:brace], out)
            self._buffer = self._buffer[brace + 1:]
            self._state = "arguments"
        elif end >= 0:  # a call without arguments
            self._open_call(self._buffer[:end], out)
            self._buffer = self._buffer[end:]
            self._state = "arguments"
        elif final:  # cut off before its name was complete: give the text back as content
            self._write_content(TOOL_CALL_START + self._buffer, out)
            self._buffer, self._state = "", "content"
        return self._state != "header"

    def _read_arguments(self, out: list[dict], final: bool) -> bool:
        text, marker, self._buffer = split_at_marker(self._buffer, (TOOL_CALL_END,), final)
        self._write_arguments(self._args.feed(text, final=final or marker is not None, cut=marker is None), out)
        if marker:
            self._state, self._after_call = "content", True
        return marker is not None

    def _open_call(self, header: str, out: list[dict]) -> None:
        name = header.strip().lstrip(":").removeprefix(CALL_PREFIX).strip()
        out.append({"tool_calls": [{"index": self._calls, "id": self._new_id(), "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})
        self._calls += 1
        self._args = Gemma4ArgsToJson()

    def _write_arguments(self, piece: str, out: list[dict]) -> None:
        if not piece:
            return
        last = out[-1]["tool_calls"][-1] if out and "tool_calls" in out[-1] else None
        if last is not None and last["index"] == self._calls - 1 and "name" not in last["function"]:
            last["function"]["arguments"] += piece
        else:
            out.append({"tool_calls": [{"index": self._calls - 1, "function": {"arguments": piece}}]})

    def _write_content(self, text: str, out: list[dict]) -> None:
        if self._after_call:
            text = text.lstrip(_SPACE)
            if not text:
                return
            self._after_call = False
        body = text.rstrip(_SPACE)
        if not body:
            self._held_space += text
            return
        keep_held = self._wrote_content or self._calls == 0
        _append_content(out, (self._held_space if keep_held else "") + body)
        self._held_space, self._wrote_content = text[len(body):], True


def _append_content(out: list[dict], text: str) -> None:
    if out and "content" in out[-1]:
        out[-1]["content"] += text
    else:
        out.append({"content": text})
