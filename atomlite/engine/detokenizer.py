"""A sequence's output text, built as tokens arrive, at a cost that follows the new tokens, not the output so far.

Text comes out per window, as in Hugging Face's TextStreamer and vLLM: the tokens from prefix_offset decode to
the text already given out for tokens up to read_offset, followed by the new text. A window whose text ends in
U+FFFD (a character whose bytes have not all arrived) waits for more tokens; finish() gives out whatever still
waits, so the final text is exactly the whole output decoded at once.

One exception: byte-fallback decoders turn a whole run of byte tokens into U+FFFDs when any byte in it is invalid
UTF-8, so a character given out early can turn into U+FFFDs later. Such text always holds a U+FFFD, and then
finish() decodes the whole output once instead.
"""
from collections.abc import Callable

REPLACEMENT_CHAR = "\ufffd"


def exact_backend(tokenizer):
    """The tokenizers.Tokenizer behind tokenizer when tokenizer.decode(ids, skip_special_tokens=True) is exactly
    that backend's decode (no text clean-up, no subclass override), so its DecodeStream replays it; else None."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    exact = (isinstance(tokenizer, TokenizersBackend) and not tokenizer.clean_up_tokenization_spaces
             and all(getattr(type(tokenizer), name) is getattr(TokenizersBackend, name)
                     for name in ("decode", "_decode")))
    return tokenizer.backend_tokenizer if exact else None


def decode_function(tokenizer, backend, skip_special_tokens: bool = True) -> Callable[[list[int]], str]:
    if tokenizer is None:
        return lambda token_ids: ""
    if backend is not None:
        return lambda token_ids: backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
    return lambda token_ids: tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """`text` holds what later tokens cannot change (but see the module's note on invalid UTF-8); after finish()
    it equals tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens). Uses tokenizers'
    DecodeStream when the tokenizer's decode is its backend's, and decodes the window itself otherwise (same rule,
    in Python)."""

    def __init__(self, tokenizer, use_decode_stream: bool = True, skip_special_tokens: bool = True):
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = self._read_offset = 0
        self._saw_replacement_char = False
        self._backend = exact_backend(tokenizer) if tokenizer is not None else None
        self._decode = decode_function(tokenizer, self._backend, skip_special_tokens)
        self._stream = None
        if self._backend is not None and use_decode_stream:
            from tokenizers.decoders import DecodeStream
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def add(self, new_token_ids: list[int]) -> str:
        """Take the next tokens; returns the text they completed (often "", or several tokens' worth)."""
        if not new_token_ids:
            return ""
        self.token_ids.extend(new_token_ids)
        new_text = self._stream_text(new_token_ids) if self._stream is not None else None
        if self._stream is None:
            new_text = self._window_text(allow_partial=False)
        if new_text is None:
            return ""
        self._advance(new_text)
        return new_text

    def finish(self) -> str:
        """Settle `text` as the whole output's decode (waiting tokens included); returns it."""
        if self._read_offset < len(self.token_ids):
            self._advance(self._window_text(allow_partial=True) or "")
        if self._saw_replacement_char:
            self.text = self._decode(self.token_ids)
        return self.text

    def _stream_text(self, new_token_ids: list[int]) -> str | None:
        try:
            return self._stream.step(self._backend, list(new_token_ids))
        except Exception:  # noqa: BLE001 (tokenizers raises a bare Exception)
            # its window's text stopped starting with the text given out: a byte run turned out invalid (see the
            # module's note); the window path gives U+FFFDs there, and finish() decodes the whole output
            self._stream = None
            return None

    def _window_text(self, allow_partial: bool) -> str | None:
        """New text of the tokens after read_offset, or None while it may still change."""
        prefix = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        window = self._decode(self.token_ids[self._prefix_offset:])
        if allow_partial or (len(window) > len(prefix) and not window.endswith(REPLACEMENT_CHAR)):
            return window[len(prefix):]
        return None

    def _advance(self, new_text: str) -> None:
        # the window's start moves to the old read offset, so the next window still decodes with some context
        # (tokenizers that drop a leading space only do so at the window's start)
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        self.text += new_text
        self._saw_replacement_char = self._saw_replacement_char or REPLACEMENT_CHAR in new_text
