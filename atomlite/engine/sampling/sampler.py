"""Next-token choice for a whole batch on the logits' device (greedy, temperature, top-k, top-p, per-request
seeds) with one device-to-host copy of the chosen ids, and logprob bookkeeping.

Sampled rows draw by the exponential race: argmax(p / E) with E ~ Exp(1) picks token i with probability p_i. Each
seeded request draws its row's E from its own generator, so its tokens do not depend on the rest of the batch.
Logprobs are those of the model's own distribution (log_softmax of the logits, before temperature or
filtering), as vLLM and the OpenAI API report them.

Logits controls (logits_controls.py) change a copy of the logits of the rows that use them, before greedy and
sampled rows choose; a batch without them runs none of that code. So does a structured_outputs bitmask
(structured.py), applied first.
"""
import torch

from atomlite.engine.sampling.logits_controls import NEG_INF, TokenHistory, apply_logits_controls, on_device
from atomlite.engine.sampling.token_mask import apply_token_bitmask
from atomlite.sampling_params import SamplingParams


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (unnormalized probabilities in descending order, the token ids of that order).

    Per row: logits / temperature, tokens less likely than min_p times the most likely one dropped, the top_k most
    likely kept (top_k >= V keeps all), then the most likely tokens until they cover top_p (the most likely one
    always stays, even when top_p is below float32's resolution)."""
    ordered, order = torch.sort(logits / temperature[:, None], dim=-1, descending=True)
    if min_p is not None:
        # p_i < min_p * p_max  <=>  logit_i - logit_max < log(min_p): no softmax needed
        ordered = ordered.masked_fill(ordered < ordered[:, :1] + torch.log(min_p)[:, None], NEG_INF)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    ordered = ordered.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    return probs.masked_fill(drop, 0.0), order


def _race_noise(shape, device, generators: list[torch.Generator | None], shared: torch.Generator) -> torch.Tensor:
    noise = torch.empty(shape, device=device).exponential_(generator=shared)
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    return noise.clamp_(min=torch.finfo(torch.float32).tiny)  # a draw of exactly 0 would make 0 / 0


def _settings(params: list[SamplingParams], vocab: int, device) -> tuple[torch.Tensor | None, ...]:
    temperature = [p.temperature for p in params]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    min_p = on_device(device, [p.min_p for p in params], torch.float32) if any(p.min_p for p in params) else None
    return (on_device(device, temperature, torch.float32), on_device(device, top_k),
            on_device(device, [p.top_p for p in params], torch.float32), min_p)


def sample_ids(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
               shared: torch.Generator, history: TokenHistory | None = None,
               bitmask: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] fp32 -> one token id per row, [N] int64 on the logits' device (launched, not waited for).
    generators[i]: row i's own (seeded) generator or None, which draws from `shared`. history: what rows using
    logits controls read (needed when one does). bitmask: [N, ceil(V / 32)] int32 on the logits' device, the
    tokens each row may choose (structured outputs). logits itself is left as it is."""
    if bitmask is not None:
        logits = apply_token_bitmask(logits, bitmask)
    if any(p.uses_logits_controls for p in params):
        if history is None:
            raise ValueError("sample_ids: rows with logits controls need the batch's TokenHistory")
        logits = apply_logits_controls(logits, params, history)
    tokens = torch.argmax(logits, dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        chosen = [params[i] for i in sampled]
        probs, order = filtered_probs(logits[rows], *_settings(chosen, logits.shape[-1], logits.device))
        noise = _race_noise(probs.shape, logits.device, [generators[i] for i in sampled], shared)
        pick = torch.argmax(probs / noise, dim=-1, keepdim=True)
        tokens[rows] = order.gather(1, pick)[:, 0]
    return tokens


class TokenLogprobs(dict):
    """{token: logprob} for the chosen token plus the top_n most likely ones, those in rank order; `rank` is the
    chosen token's rank in the whole vocabulary (1 = the most likely), as vLLM reports it."""
    rank: int = 0


def token_logprobs(logprobs: torch.Tensor, token: int, top_n: int) -> TokenLogprobs:
    result = TokenLogprobs()
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.shape[-1]))
        result.update(zip(ids.tolist(), values.tolist()))
    chosen = logprobs[token]
    result[token] = float(chosen)
    result.rank = int((logprobs > chosen).sum()) + 1
    return result
