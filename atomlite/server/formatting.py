"""OpenAI response bodies (completions, chat, their stream chunks, logprobs) from engine deltas."""
import time
from dataclasses import dataclass, field

from atomlite.engine.ipc.client import Delta, logprobs_with_texts, token_text
from atomlite.outputs import with_ranks
from atomlite.server.chat import OutputParsers


@dataclass
class Choice:
    """What one choice has received so far."""
    index: int
    prompt_index: int
    prompt_ids: list[int]
    prompt_text: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, delta: Delta) -> None:
        self.token_ids += delta.token_ids
        self.text += delta.text
        self.logprobs += delta.logprobs
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.finished:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason

    def echoed(self, text: str, token_ids: list[int], entries: list) -> tuple[str, list[int], list]:
        """text, its tokens and their logprob entries behind the prompt's, for echo (prompt tokens without a score
        where prompt logprobs were not asked for)."""
        return ((self.prompt_text or "") + text, self.prompt_ids + token_ids,
                (self.prompt_logprobs or [None] * len(self.prompt_ids)) + entries)


class TokenIdTexts:
    """vLLM's return_tokens_as_token_ids: each logprob token shown as "token_id:N"."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return f"token_id:{ids[0]}"


class Formatter:
    def __init__(self, tokenizer, model_name: str):
        self.tokenizer, self.model_name = tokenizer, model_name

    def token_texts(self, as_ids: bool | None):
        """What logprob tokens are written with: the tokenizer, or token ids (return_tokens_as_token_ids)."""
        return TokenIdTexts() if as_ids else self.tokenizer

    def prompt_logprobs(self, choice: Choice) -> list | None:
        """vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob, rank,
        decoded_token}}."""
        if choice.prompt_logprobs is None:
            return None
        entries = [with_ranks(entry, token, lambda t: token_text(self.tokenizer, t))
                   for entry, token in zip(choice.prompt_logprobs, choice.prompt_ids)]
        return [None if e is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank,
                                                  "decoded_token": lp.decoded_token} for t, lp in e.items()}
                for e in entries]

    def header(self, request_id: str, kind: str) -> dict:
        return {"id": request_id, "object": kind, "created": int(time.time()), "model": self.model_name}

    # -- completions -----------------------------------------------------------------------------------------
    def completion_logprobs(self, tokens: list[int], entries: list, offset: int = 0,
                            as_ids: bool | None = None) -> dict:
        """OpenAI legacy logprobs: tokens, token_logprobs, top_logprobs, text_offset (None entries: no score)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token in logprobs_with_texts(self.token_texts(as_ids), tokens, entries):
            out["tokens"].append(token.text)
            out["text_offset"].append(offset)
            offset += len(token.text)
            out["token_logprobs"].append(token.logprob)
            out["top_logprobs"].append(None if token.candidates is None else dict(token.candidates))
        return out

    def completion_choice(self, choice: Choice, echo: bool, want_logprobs: bool, token_ids: bool = False,
                          req=None) -> dict:
        """req: the CompletionRequest, for vLLM's extras (prompt_logprobs, return_tokens_as_token_ids)."""
        text, tokens, entries = choice.text, choice.token_ids, choice.logprobs
        if echo:
            text, tokens, entries = choice.echoed(text, tokens, entries)
        as_ids = req is not None and req.return_tokens_as_token_ids
        logprobs = self.completion_logprobs(tokens, entries, as_ids=as_ids) if want_logprobs else None
        body = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason}
        if req is not None and req.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs(choice)
        if token_ids:
            body.update(prompt_token_ids=choice.prompt_ids, token_ids=choice.token_ids)
        return body

    def completion(self, request_id: str, choices: list[Choice], echo: bool, want_logprobs: bool,
                   token_ids: bool = False, req=None) -> dict:
        body = self.header(request_id, "text_completion")
        body["choices"] = [self.completion_choice(c, echo, want_logprobs, token_ids, req) for c in choices]
        body["usage"] = usage(choices)
        return body

    def completion_chunk(self, request_id: str, index: int, text: str, logprobs: dict | None,
                         finish_reason: str | None, token_ids: list[int] | None = None) -> dict:
        body = self.header(request_id, "text_completion")
        body["choices"] = [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]
        if token_ids is not None:
            body["choices"][0]["token_ids"] = token_ids
        return body

    # -- chat ------------------------------------------------------------------------------------------------
    def chat_logprobs(self, tokens: list[int], entries: list, top: int, as_ids: bool | None = None) -> dict:
        content = []
        for token in logprobs_with_texts(self.token_texts(as_ids), tokens, entries):
            ranked = sorted(token.candidates, key=lambda candidate: -candidate[1])[:top]
            content.append({**chat_token(token.text, token.logprob),
                            "top_logprobs": [chat_token(text, logprob) for text, logprob in ranked]})
        return {"content": content}

    def chat(self, request_id: str, choices: list[Choice], top_logprobs: int | None, token_ids: bool = False,
             parsers: OutputParsers | None = None, req=None) -> dict:
        """parsers: those reading each choice's text into content, reasoning_content and tool_calls; req: the
        ChatCompletionRequest, for vLLM's extras (echo, include_reasoning, prompt_logprobs,
        return_tokens_as_token_ids)."""
        body = self.header(request_id, "chat.completion")
        body["choices"] = []
        as_ids = req is not None and req.return_tokens_as_token_ids
        for c in choices:
            message = parsers.message(c.text) if parsers is not None and parsers.active else {"content": c.text}
            if req is not None:
                message = chat_message_extras(message, req)
            body["choices"].append({
                "index": c.index, "message": {"role": "assistant", **message},
                "logprobs": self.chat_logprobs(c.token_ids, c.logprobs, top_logprobs, as_ids)
                if top_logprobs is not None else None,
                "finish_reason": chat_finish_reason(c.finish_reason, bool(message.get("tool_calls"))),
                "stop_reason": c.stop_reason,
                **({"token_ids": c.token_ids} if token_ids else {})})
        if token_ids:
            body["prompt_token_ids"] = choices[0].prompt_ids
        if req is not None and req.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs(choices[0])
        body["usage"] = usage(choices)
        return body

    def chat_chunk(self, request_id: str, index: int, delta: dict, logprobs: dict | None,
                   finish_reason: str | None, token_ids: list[int] | None = None) -> dict:
        body = self.header(request_id, "chat.completion.chunk")
        body["choices"] = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
        if token_ids is not None:
            body["choices"][0]["token_ids"] = token_ids
        return body


def chat_message_extras(message: dict, req) -> dict:
    """vLLM's chat extras on a whole answer: echo puts the last message's text first; include_reasoning false
    drops reasoning_content."""
    message = dict(message)
    if not req.include_reasoning:
        message.pop("reasoning_content", None)
    echoed = req.echoed_text(req.messages)
    if echoed:
        message["content"] = echoed + (message.get("content") or "")
    return message


def chat_token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_finish_reason(reason: str | None, made_tool_calls: bool) -> str | None:
    """OpenAI's: an answer that ends in tool calls finishes with "tool_calls"."""
    return "tool_calls" if made_tool_calls and reason == "stop" else reason


def merged_delta(deltas: list[dict]) -> dict:
    """Parser deltas of one engine step as one chunk's delta (texts joined, tool call pieces in order)."""
    out: dict = {}
    for delta in deltas:
        for field, value in delta.items():
            out[field] = out.get(field, [] if field == "tool_calls" else "") + value
    return out


def usage(choices: list[Choice]) -> dict:
    prompt_tokens = sum({c.prompt_index: len(c.prompt_ids) for c in choices}.values())
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
