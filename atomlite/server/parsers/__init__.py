"""Parsers that turn a model's raw output text (special tokens kept) into OpenAI chat fields.

Each parser has a complete form (whole text in, fields out) and a streaming form (text deltas in, OpenAI
deltas out) built on the same state machine, so a stream's deltas always join into the complete result.
"""


def split_at_marker(buffer: str, markers: tuple[str, ...], final: bool) -> tuple[str, str | None, str]:
    """(text before the first marker, that marker or None, what follows it).

    Without a marker, the text that may still grow into one (a tail that is a marker's prefix) is returned as
    the rest instead, unless `final` says no more text is coming.
    """
    hits = [(buffer.find(m), -len(m), m) for m in markers if m in buffer]
    if hits:
        pos, _, marker = min(hits)
        return buffer[:pos], marker, buffer[pos + len(marker):]
    held = 0 if final else partial_marker_len(buffer, markers)
    return buffer[:len(buffer) - held], None, buffer[len(buffer) - held:]


def partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    longest = min(len(text), max(len(m) for m in markers) - 1)
    for size in range(longest, 0, -1):
        if any(m.startswith(text[-size:]) for m in markers):
            return size
    return 0


class DeltaStream:
    """The streaming form: text deltas in (feed, then finish once), OpenAI deltas out. A subclass reads its buffer
    in steps (`_read`: False once it must wait for more text) and may add what only the end can say (`_flush`)."""

    def __init__(self):
        self._buffer = ""

    def feed(self, text: str) -> list[dict]:
        return self._run(text, final=False)

    def finish(self) -> list[dict]:
        return self._run("", final=True)

    def _run(self, text: str, final: bool) -> list[dict]:
        self._buffer += text
        out: list[dict] = []
        while self._read(out, final):
            pass
        if final:
            self._flush(out)
        return out

    def _read(self, out: list[dict], final: bool) -> bool:
        raise NotImplementedError

    def _flush(self, out: list[dict]) -> None:
        pass
