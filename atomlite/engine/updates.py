"""What the engine hands out per step: token updates per sequence and the engine's counters. These are the messages
the engine core sends to the API process (one message per step), so they hold plain data only."""
from dataclasses import dataclass, field


@dataclass(slots=True)
class SeqUpdate:
    """The output tokens one sequence got since its last update (usually one), and how it finished."""
    request_id: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None = None  # one entry per new token, when the request asked for them
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    prompt_logprobs: list | None = None  # with the first update, when asked for
    num_cached_tokens: int = 0
    queue_s: float | None = None  # first update: from arrival to first scheduled
    prefill_s: float | None = None  # first update: from first scheduled to the first token
    error: str | None = None  # the request failed: the engine could not run it
    invalid: bool = False  # the error is the request's fault (a bad prompt or parameter)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass(slots=True)
class EngineStats:
    """Gauges at the end of a step, totals since the engine started, and the tokens of each forward pass since the
    last stats."""
    num_running: int
    num_waiting: int
    kv_usage: list[tuple[str, int, int]]  # per KV group: kind, blocks used, blocks in the pool
    num_preemptions: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found
    iteration_tokens: list[int] = field(default_factory=list)
    spec: object = None  # the drafts' acceptance counters (spec.stats.SpecStats), with speculative decoding
    num_added: int = 0  # requests the engine has taken in, so a client can count the ones still on their way
    forward_passes: dict[str, int] = field(default_factory=dict)  # since start, by path: "graph", "eager"
    lora: tuple | None = None  # with LoRA: (max_loras, running adapter names, waiting adapter names)
