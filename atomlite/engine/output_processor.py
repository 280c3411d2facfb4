"""The engine's token updates turned into what a client sees: text detokenized as tokens arrive, stop strings, the
part of each that is new, and logprob entries with their tokens' texts. One place for both the offline `LLM` and
the server (which runs it in the API process, away from the engine)."""
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from atomlite.engine.detokenizer import IncrementalDetokenizer
from atomlite.engine.updates import SeqUpdate
from atomlite.outputs import CompletionOutput, RequestOutput, with_ranks
from atomlite.sampling_params import SamplingParams


@dataclass
class Delta:
    """What is new for one sequence: tokens, the text that may be sent, their logprobs; and how it finished."""
    token_ids: list[int]
    text: str
    logprobs: list[dict[int, float]]
    finished: bool = False
    finish_reason: str | None = None
    prompt_logprobs: list | None = None
    stop_reason: int | str | None = None

    def merged(self, later: "Delta") -> "Delta":
        return Delta(self.token_ids + later.token_ids, self.text + later.text, self.logprobs + later.logprobs,
                     later.finished, later.finish_reason,
                     self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs,
                     later.stop_reason)


@dataclass
class RequestState:
    """One sequence's output so far. `update()` takes the engine's next update and returns the delta to send; a
    stop string found in the text finishes the request here (`stopped`), and the engine, which has not seen the
    text, must then abort it (StepOutputs.stopped)."""
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    tokenizer: object = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list | None = None
    text: str = ""
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    stopped: bool = False  # finished on a stop string, which the engine does not know of
    stop_reason: int | str | None = None  # vLLM's: the stop string or stop token id that ended the output

    def __post_init__(self):
        self.detokenizer = IncrementalDetokenizer(self.tokenizer,
                                                  skip_special_tokens=self.params.skip_special_tokens)
        self._held = max(map(len, self.params.stop)) - 1 if self.params.stop else 0
        self._sent_text = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, u: SeqUpdate) -> Delta:
        if self.params.stop and len(u.token_ids) > 1:
            return self._update_token_by_token(u)
        first = not self.token_ids and self.finish_reason is None
        self.token_ids += u.token_ids
        if u.logprobs is not None:
            self.logprobs += u.logprobs
        if u.prompt_logprobs is not None:
            self.prompt_logprobs = u.prompt_logprobs
        self.num_cached_tokens = u.num_cached_tokens
        text_before = len(self.detokenizer.text)
        if self.detokenizer.add(self._text_tokens(u)) and self.params.stop and self._cut_at_stop_string(text_before):
            self.finish_reason, self.stopped = "stop", True
        elif u.finish_reason is not None:
            self.finish_reason, self.text = u.finish_reason, self.detokenizer.finish()
            if u.finish_reason == "stop" and self.token_ids and self.token_ids[-1] in self.params.stop_token_ids:
                self.stop_reason = self.token_ids[-1]
        return self._delta(u, first)

    def _update_token_by_token(self, u: SeqUpdate) -> Delta:
        """Several tokens at once (accepted drafts) under stop strings: each is taken as if it came alone, so the
        output ends at the token that completed a stop string, as it does without drafts."""
        delta = None
        for i, token in enumerate(u.token_ids):
            last = i == len(u.token_ids) - 1
            one = replace(u, token_ids=[token], logprobs=None if u.logprobs is None else u.logprobs[i:i + 1],
                          finish_reason=u.finish_reason if last else None,
                          prompt_logprobs=u.prompt_logprobs if i == 0 else None)
            step = self.update(one)
            delta = step if delta is None else delta.merged(step)
            if self.finished:
                break
        return delta

    def _text_tokens(self, u: SeqUpdate) -> list[int]:
        """The tokens whose text the client sees: with special tokens kept in the text, the special token that
        ended the output (EOS, end of turn) is still left out, as vLLM leaves out stop tokens."""
        ids = u.token_ids
        if (self.params.skip_special_tokens or u.finish_reason != "stop" or not ids or self.tokenizer is None
                or ids[-1] not in self.tokenizer.all_special_ids):
            return ids
        return ids[:-1]

    def _cut_at_stop_string(self, text_before: int) -> bool:
        """Search the text the new tokens completed for a stop string; on a match keep only the text before it.
        Earlier text was searched before, so a match can start no sooner than the longest stop string (less one
        character) before the new text."""
        text = self.detokenizer.text
        start = max(0, text_before - max(map(len, self.params.stop)) + 1)
        found = [(i, s) for s in self.params.stop if (i := text.find(s, start)) >= 0]
        if not found:
            return False
        cut, self.stop_reason = min(found, key=lambda match: match[0])
        self.text = text[:cut + len(self.stop_reason)] if self.params.include_stop_str_in_output else text[:cut]
        return True

    def _delta(self, u: SeqUpdate, first: bool) -> Delta:
        if self.finished:
            sendable, text = len(self.text), self.text
        else:  # a stop string may still complete in the tail, which would then be cut: the tail waits
            text = self.detokenizer.text
            sendable = max(len(text) - self._held, self._sent_text)
        new_text = text[self._sent_text:sendable]
        self._sent_text = sendable
        return Delta(u.token_ids, new_text, u.logprobs or [], self.finished, self.finish_reason,
                     self.prompt_logprobs if first and self.params.prompt_logprobs is not None else None,
                     self.stop_reason)

    def completion(self, index: int = 0) -> CompletionOutput:
        """The output as vLLM's CompletionOutput: logprobs as {token id: Logprob} with ranks and texts."""
        logprobs = cumulative = None
        if self.params.logprobs is not None:
            logprobs = [with_ranks(entry, token, self._decode) for entry, token in zip(self.logprobs, self.token_ids)]
            cumulative = sum(entry[token] for entry, token in zip(self.logprobs, self.token_ids))
        return CompletionOutput(index, self.text, list(self.token_ids), logprobs, self.finish_reason, cumulative,
                                self.stop_reason)

    def output(self, prompt: str | None = None) -> RequestOutput:
        prompt_logprobs = None
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is not None:
            prompt_logprobs = [with_ranks(entry, token, self._decode)
                               for entry, token in zip(self.prompt_logprobs, self.prompt_token_ids)]
        return RequestOutput(self.request_id, prompt, list(self.prompt_token_ids), prompt_logprobs,
                             [self.completion()], self.finished, self.num_cached_tokens)

    def _decode(self, token: int) -> str:
        return token_text(self.tokenizer, token)


def is_last(item: Delta | Exception) -> bool:
    """Whether a request's stream ends with this item: its finishing delta, or the error it failed with."""
    return isinstance(item, Exception) or item.finished


def failure(u: SeqUpdate) -> Exception:
    """A failed update as the exception its client gets: a ValueError where the request was at fault."""
    return (ValueError if u.invalid else RuntimeError)(u.error)


@dataclass(slots=True)
class StepOutputs:
    """What one engine step gave the open requests: each one's delta (or the error it failed with) beside the update
    it came from; and the requests a stop string finished, which the engine has not heard of and must abort."""
    outputs: list[tuple[SeqUpdate, Delta | Exception]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)

    @property
    def num_finished(self) -> int:
        return sum(is_last(item) for _, item in self.outputs)


class OutputProcessor:
    """The open requests' RequestStates: one engine step's updates in, each request's delta out. A request leaves
    once it finishes, fails or is aborted; updates that still come for it are ignored (a step launched ahead may
    carry a token for a request a stop string already finished)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> RequestState:
        state = RequestState(request_id, prompt_token_ids, params, self.tokenizer)
        self.requests[request_id] = state
        return state

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def process(self, updates: Iterable[SeqUpdate]) -> StepOutputs:
        """One engine step's updates as its open requests' deltas and the requests the engine must now abort."""
        step = StepOutputs()
        for u in updates:
            state = self.requests.get(u.request_id)
            if state is None:
                continue
            item = failure(u) if u.error is not None else state.update(u)
            if state.stopped:
                step.stopped.append(u.request_id)
            if is_last(item):
                del self.requests[u.request_id]
            step.outputs.append((u, item))
        return step


def token_text(tokenizer, token: int) -> str:
    """One token's own text, as logprobs show it: special tokens as their text, `<id>` without a tokenizer."""
    return tokenizer.decode([token]) if tokenizer is not None else f"<{token}>"


@dataclass(slots=True)
class TokenLogprob:
    """A token's logprob entry with texts: the token's own text and logprob, and each candidate the engine scored
    (the top ones and the token itself) as (text, logprob), in the engine's order. A token without a score (a
    prompt's first) has logprob and candidates None."""
    text: str
    logprob: float | None = None
    candidates: list[tuple[str, float]] | None = None


def logprobs_with_texts(tokenizer, token_ids: list[int],
                        entries: list[dict[int, float] | None]) -> list[TokenLogprob]:
    """The engine's logprob entries ({token id: logprob}, one per token) with their tokens' texts."""
    out = []
    for token, entry in zip(token_ids, entries):
        text = token_text(tokenizer, token)
        if entry is None:
            out.append(TokenLogprob(text))
        else:
            candidates = [(text if t == token else token_text(tokenizer, t), lp) for t, lp in entry.items()]
            out.append(TokenLogprob(text, entry[token], candidates))
    return out
