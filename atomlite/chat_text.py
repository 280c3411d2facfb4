"""Chat content is text: a special token's text that a client writes (`<start_of_turn>` in a user message, a tool
result, a tool's description, a string template kwarg) must not become the special token, or a user could forge a
turn, a system prompt or a tool call.

Every string the client wrote is marked before the template renders it: each special token's text inside it is
wrapped in two Unicode noncharacters (which a client's own text loses first). The rendered text is then tokenized
piece by piece: what the template wrote as before, special tokens recognized; each marked piece as plain text
(split_special_tokens), so it becomes ordinary tokens, as it would in the middle of any other text."""
import re

OPEN, CLOSE = "\ufdd0", "\ufdd1"  # noncharacters: never meaningful in a client's text
_MARKED = re.compile(f"{OPEN}(.*?){CLOSE}", re.DOTALL)
# keys whose values are the request's structure or addresses, not text the template shows
_NOT_TEXT = {"role", "type", "url", "tool_call_id", "id"}


def special_token_texts(tokenizer) -> list[str]:
    """The texts of the tokenizer's special tokens, longest first."""
    texts = set(getattr(tokenizer, "all_special_tokens", []))
    texts |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    return sorted((t for t in texts if t), key=len, reverse=True)


class ContentGuard:
    """Marks a client's strings and tokenizes a rendered chat so that special tokens come only from the template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        texts = self.special_texts = special_token_texts(tokenizer)
        self._special = re.compile("|".join(map(re.escape, texts))) if texts else None

    def mark(self, value):
        """value (a string, or lists and dicts of them) with each special token's text marked as plain text."""
        if isinstance(value, str):
            value = value.replace(OPEN, "").replace(CLOSE, "")
            return self._special.sub(lambda m: f"{OPEN}{m.group(0)}{CLOSE}", value) if self._special else value
        if isinstance(value, list):
            return [self.mark(v) for v in value]
        if isinstance(value, dict):
            return {k: v if k in _NOT_TEXT else self.mark(v) for k, v in value.items()}
        return value

    def structure_kwargs(self, template_kwargs: dict) -> list[str]:
        """The template variables among template_kwargs that name special tokens (bos_token, eos_token, ...): the
        template's structure, with which a caller could write any turn it likes."""
        specials = set(getattr(self.tokenizer, "special_tokens_map", {})) | set(self.special_texts)
        return sorted(k for k in template_kwargs if k in specials or k.endswith(("_token", "_tokens")))

    def encode(self, text: str) -> list[int]:
        """Token ids of a rendered chat whose client strings were marked."""
        if OPEN not in text:
            return self.tokenizer.encode(text, add_special_tokens=False)
        ids, pieces = [], _MARKED.split(text)
        for i, piece in enumerate(pieces):
            if not piece:
                continue
            if i % 2:
                ids += self.tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True)
            else:  # a mark the template cut in two is dropped, not read
                ids += self.tokenizer.encode(unmarked(piece), add_special_tokens=False)
        return ids


def unmarked(text: str) -> str:
    return text.replace(OPEN, "").replace(CLOSE, "")
