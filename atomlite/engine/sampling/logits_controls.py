"""Logits controls, vLLM's and in its order: allowed ids, bad words, min_tokens, logit bias, then the repetition,
frequency and presence penalties. Each changes the rows that use it; index lists are built on the host from the
token lists, and whatever depends on a token still in flight (a step launched ahead) is decided on the device."""
from collections.abc import Collection
from dataclasses import dataclass

import torch

from atomlite.engine.sequence import Sequence
from atomlite.sampling_params import SamplingParams

NEG_INF = float("-inf")


def on_device(device, values: list, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


@dataclass(slots=True)
class TokenHistory:
    """What logits controls read besides the logits: each row's sequence (its prompt and the output tokens the host
    holds), the model's EOS ids (min_tokens holds them back with the stop ids), and, for a step the engine launched
    ahead, each row's newest output token: sampled on the device, not in seq.token_ids yet."""
    seqs: list[Sequence]
    eos_token_ids: Collection[int] = ()
    in_flight: torch.Tensor | None = None  # [N] int64 on the logits' device

    def num_output_tokens(self, row: int) -> int:
        return self.seqs[row].num_output_tokens + (self.in_flight is not None)


def apply_logits_controls(logits: torch.Tensor, params: list[SamplingParams], history: TokenHistory) -> torch.Tensor:
    """A copy of logits [N, V] with each row's controls applied, in vLLM's order. Index lists are built on the host
    from the token lists; whatever depends on the in-flight tokens is decided on the device, so nothing waits."""
    logits = logits.clone()
    _allow_only(logits, params)
    _block_bad_words(logits, params, history)
    _hold_back_stops(logits, params, history)
    _add_logit_bias(logits, params)
    penalized = [i for i, p in enumerate(params) if p.uses_penalties]
    if penalized:
        rows = on_device(logits.device, penalized)
        logits[rows] = _penalized(logits[rows], [params[i] for i in penalized],
                                  [history.seqs[i] for i in penalized],
                                  None if history.in_flight is None else history.in_flight[rows])
    return logits


def _allow_only(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    limited = [i for i, p in enumerate(params) if p.allowed_token_ids is not None]
    if not limited:
        return
    local = [k for k, i in enumerate(limited) for _ in params[i].allowed_token_ids]
    tokens = [t for i in limited for t in params[i].allowed_token_ids]
    allowed = torch.zeros(len(limited), logits.shape[-1], dtype=torch.bool, device=logits.device)
    allowed[on_device(logits.device, local), on_device(logits.device, tokens)] = True
    rows = on_device(logits.device, limited)
    logits[rows] = logits[rows].masked_fill(~allowed, NEG_INF)


class BadWordIndex:
    """A request's bad words grouped by the tokens before their last, so that a step looks up the few words its
    output ends in the start of rather than walking every word (20,000 words took 20 ms a step, each step).

    ends[n][prefix]: the last tokens of the words whose first n tokens are prefix (n = 0: blocked always).
    heads[n][head]: for a step launched ahead, whose newest output token is still on the device: the words of
    n + 2 tokens whose first n are head, as two lists: the token after head (which the in-flight token
    must be) and the word's last token."""

    def __init__(self, words: list[list[int]]):
        self.ends: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self.heads: dict[int, dict[tuple[int, ...], tuple[list[int], list[int]]]] = {}
        for word in words:
            prefix = tuple(word[:-1])
            self.ends.setdefault(len(prefix), {}).setdefault(prefix, []).append(word[-1])
            if prefix:
                needs, lasts = self.heads.setdefault(len(prefix) - 1, {}).setdefault(prefix[:-1], ([], []))
                needs.append(prefix[-1])
                lasts.append(word[-1])

    def blocked(self, seq: Sequence, in_flight: bool) -> tuple[list[int], list[int]]:
        """(tokens, needs): the tokens to block in seq's row, each with the token the in-flight one must be for it
        to hold (-1: it holds already)."""
        tokens = list(self.ends.get(0, {}).get((), ()))
        needs = [-1] * len(tokens)
        groups = self.heads if in_flight else {n: ends for n, ends in self.ends.items() if n}
        for n, by_prefix in groups.items():
            found = by_prefix.get(tuple(seq.token_ids[len(seq.token_ids) - n:])) \
                if seq.num_output_tokens >= n else None
            if found is None:
                continue
            if in_flight:
                needs += found[0]
                tokens += found[1]
            else:
                tokens += found
                needs += [-1] * len(found)
        return tokens, needs


def bad_word_index(params: SamplingParams) -> BadWordIndex:
    """params' BadWordIndex, built on its first step and kept with it (bind_to_model drops it)."""
    if params._bad_words_index is None:
        params._bad_words_index = BadWordIndex(params.bad_words_token_ids)
    return params._bad_words_index


def _block_bad_words(logits: torch.Tensor, params: list[SamplingParams], history: TokenHistory) -> None:
    in_flight = history.in_flight is not None
    rows, tokens, needs = [], [], []
    for i, p in enumerate(params):
        if p.bad_words_token_ids:
            row_tokens, row_needs = bad_word_index(p).blocked(history.seqs[i], in_flight)
            rows += [i] * len(row_tokens)
            tokens += row_tokens
            needs += row_needs
    if not rows:
        return
    rows, tokens, needs = (on_device(logits.device, column) for column in (rows, tokens, needs))
    hit = needs < 0
    if in_flight:
        hit |= history.in_flight[rows] == needs
    # added, not assigned: a token blocked by one word and spared by another (same row) must stay blocked
    logits.index_put_((rows, tokens), torch.where(hit, NEG_INF, 0.0), accumulate=True)


def _hold_back_stops(logits: torch.Tensor, params: list[SamplingParams], history: TokenHistory) -> None:
    vocab = logits.shape[-1]
    rows, tokens = [], []
    for i, p in enumerate(params):
        if p.min_tokens and history.num_output_tokens(i) < p.min_tokens:
            stops = {t for t in (*p.stop_token_ids, *history.eos_token_ids) if t < vocab}
            rows += [i] * len(stops)
            tokens += stops
    if rows:
        logits[on_device(logits.device, rows), on_device(logits.device, tokens)] = NEG_INF


def _add_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    biased = [(i, p.logit_bias) for i, p in enumerate(params) if p.logit_bias]
    if not biased:
        return
    device = logits.device
    rows = on_device(device, [i for i, bias in biased for _ in bias])
    tokens = on_device(device, [t for _, bias in biased for t in bias])
    values = on_device(device, [v for _, bias in biased for v in bias.values()], torch.float32)
    logits.index_put_((rows, tokens), values, accumulate=True)


def _padded(lists: list[list[int]], pad: int, device) -> torch.Tensor:
    width = max(map(len, lists))
    return on_device(device, [ids + [pad] * (width - len(ids)) for ids in lists])


def _counts(lists: list[list[int]], vocab: int, device) -> torch.Tensor:
    """[len(lists), vocab] float32: how often each token occurs in each list."""
    ids = _padded(lists, vocab, device)  # the padding lands in an extra column, dropped
    counts = torch.zeros(len(lists), vocab + 1, device=device)
    return counts.scatter_add_(1, ids, torch.ones(ids.shape, device=device))[:, :vocab]


def _penalized(logits: torch.Tensor, params: list[SamplingParams], seqs: list[Sequence],
               in_flight: torch.Tensor | None) -> torch.Tensor:
    vocab, device = logits.shape[-1], logits.device
    counts = _counts([s.output_token_ids for s in seqs], vocab, device)
    if in_flight is not None:
        counts.scatter_add_(1, in_flight[:, None], torch.ones(len(seqs), 1, device=device))
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = (_counts([s.prompt_token_ids for s in seqs], vocab, device) > 0) | (counts > 0)
        penalty = on_device(device, [p.repetition_penalty for p in params], torch.float32)[:, None]
        scale = torch.where(seen, penalty, 1.0)
        logits = torch.where(logits > 0, logits / scale, logits * scale)
    frequency = on_device(device, [p.frequency_penalty for p in params], torch.float32)[:, None]
    presence = on_device(device, [p.presence_penalty for p in params], torch.float32)[:, None]
    return logits - frequency * counts - presence * (counts > 0)
