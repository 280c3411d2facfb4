"""Next-token choice per sequence (greedy, temperature, top-k, top-p, seeded) and logprob bookkeeping.

Logprobs are those of the model's own distribution (log_softmax of the logits, before temperature or
filtering), as vLLM and the OpenAI API report them.
"""
import torch

from atomlite.sampling_params import SamplingParams


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token once the tokens before it already cover top_p; the most likely token always stays
        # (a top_p below float32's smallest value would otherwise drop it too)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample_one(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits [V] fp32."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = _filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [N, V] -> one token per row. Greedy rows are decided together in one argmax."""
    tokens = torch.argmax(logits, dim=-1).tolist()
    for i, p in enumerate(params):
        if not p.greedy:
            tokens[i] = sample_one(logits[i], p, generators[i])
    return tokens


def token_logprobs(logprobs: torch.Tensor, token: int, top_n: int) -> dict[int, float]:
    """{token: logprob} for the chosen token plus the top_n most likely ones."""
    result = {}
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.shape[-1]))
        result = dict(zip(ids.tolist(), values.tolist()))
    result[token] = float(logprobs[token])
    return result
