"""Gemma 4 thinking in the model's output -> OpenAI `reasoning_content` and `content` (complete and streaming).

The model thinks in a channel, `<|channel>thought\\n...<channel|>`, then answers. The chat template turns thinking
on with `enable_thinking=True` (a `<|think|>` token at the top of the system turn); otherwise it ends the
generation prompt with an empty channel, `<|channel>thought\\n<channel|>`, and the output holds none.
"""
from atomlite.server.parsers import DeltaStream, split_at_marker
from atomlite.server.parsers.gemma4_tools import TOOL_CALL_START

CHANNEL_START = "<|channel>"
CHANNEL_END = "<channel|>"
THOUGHT_LABEL = "thought\n"
THINK_TOKEN = "<|think|>"  # in the prompt only: what enable_thinking=True adds
EMPTY_THOUGHT = CHANNEL_START + THOUGHT_LABEL + CHANNEL_END  # in the prompt only: thinking off


def parse_reasoning(text: str, started_in_thinking: bool = False) -> tuple[str | None, str | None]:
    """(reasoning_content, content) of a complete model output; None where empty."""
    stream = Gemma4ReasoningStream(started_in_thinking)
    return join_reasoning_deltas(stream.feed(text) + stream.finish())


def join_reasoning_deltas(deltas: list[dict]) -> tuple[str | None, str | None]:
    """What a client rebuilds from the deltas of a stream."""
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    return reasoning or None, content or None


class Gemma4ReasoningStream(DeltaStream):
    """Fed successive text deltas, returns {"reasoning_content": ...} and {"content": ...} deltas.

    Channel text is reasoning, without its `thought\\n` label; everything else is content. An end marker with no
    channel open is dropped. A tool call inside an unterminated channel ends it and goes on as content, where
    the tool parser finds it. `started_in_thinking`: the prompt itself opened the channel.
    """

    def __init__(self, started_in_thinking: bool = False):
        super().__init__()
        self._thinking = self._label_pending = started_in_thinking

    def _read(self, out: list[dict], final: bool) -> bool:
        return (self._read_thinking if self._thinking else self._read_content)(out, final)

    def _read_content(self, out: list[dict], final: bool) -> bool:
        text, marker, self._buffer = split_at_marker(self._buffer, (CHANNEL_START, CHANNEL_END), final)
        _append(out, "content", text)
        if marker == CHANNEL_START:
            self._thinking = self._label_pending = True
        return marker is not None

    def _read_thinking(self, out: list[dict], final: bool) -> bool:
        if self._label_pending:
            if not final and THOUGHT_LABEL.startswith(self._buffer):
                return False
            self._buffer = self._buffer.removeprefix(THOUGHT_LABEL)
            self._label_pending = False
        text, marker, self._buffer = split_at_marker(self._buffer, (CHANNEL_END, TOOL_CALL_START), final)
        _append(out, "reasoning_content", text)
        if marker == TOOL_CALL_START:
            self._buffer = marker + self._buffer
        self._thinking = marker is None
        return marker is not None


def _append(out: list[dict], field: str, text: str) -> None:
    if not text:
        return
    if out and field in out[-1]:
        out[-1][field] += text
    else:
        out.append({field: text})
