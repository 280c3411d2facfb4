"""What LLM.generate and LLM.chat return, shaped as vLLM's RequestOutput, CompletionOutput and Logprob."""
from dataclasses import dataclass, field


class Logprob(float):
    """vLLM's Logprob: .logprob, .rank (1 = the most likely token of the vocabulary) and .decoded_token. It is also
    the float of its logprob, so code that reads logprobs as numbers keeps working."""

    def __new__(cls, logprob: float, rank: int | None = None, decoded_token: str | None = None):
        value = super().__new__(cls, logprob)
        value.rank, value.decoded_token = rank, decoded_token
        return value

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"

    def __reduce__(self):
        return Logprob, (float(self), self.rank, self.decoded_token)


def with_ranks(entry: dict[int, float] | None, token: int, decode) -> dict[int, Logprob] | None:
    """An engine logprob entry (the top candidates in rank order, then the chosen token, whose vocabulary rank the
    entry's `rank` holds) as {token id: Logprob}; decode(id) gives each token's text."""
    if entry is None:
        return None
    chosen_rank = getattr(entry, "rank", None)
    out = {}
    for position, (candidate, logprob) in enumerate(entry.items(), 1):
        rank = chosen_rank if candidate == token and chosen_rank else position
        out[candidate] = Logprob(logprob, rank, decode(candidate))
    return out


@dataclass
class CompletionOutput:
    """One output sequence. cumulative_logprob: the sum of its tokens' logprobs, where logprobs were asked for;
    stop_reason: the stop string or stop token id that ended it (None for EOS or the length limit)."""
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    cumulative_logprob: float | None = None
    stop_reason: int | str | None = None
    lora_request: None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: None = None
    lora_request: None = None
    encoder_prompt: None = None
    encoder_prompt_token_ids: None = None
