"""Verification of draft tokens in one target forward, by exact rejection sampling.

A sequence whose newest token sits at position p runs p..p+k in one step: its newest token and k drafts d_1..d_k.
Row i's logits (the target's distribution for position p+i+1) decide draft d_{i+1}. Drafts are deterministic
proposals (a one-hot draft distribution), so for a row with distribution P after the request's temperature, top-k,
top-p and min-p:
- accept d with probability P(d);
- on rejection, the token comes from P with d removed (renormalized);
- after k accepted drafts, the last row gives one more token from P (the bonus token).
Each output token then has exactly P's law: P(d) by acceptance, P(x) = (1 - P(d)) * P(x) / (1 - P(d)) otherwise. A
greedy row accepts d when it is the argmax, so greedy output is token for token what decoding one at a time gives.
"""
from dataclasses import dataclass

import torch

from atomlite.engine.sampling.logits_controls import TokenHistory, apply_logits_controls
from atomlite.engine.sampling.sampler import _race_noise, _settings, filtered_probs
from atomlite.engine.sequence import Sequence

NO_DRAFT = -1  # the bonus row: nothing to decide, a token to sample


@dataclass
class VerifyRows:
    """The rows of the sequences that verify drafts: each one's first logit row and its drafts."""
    seqs: list[Sequence]
    first_rows: list[int]
    drafts: list[list[int]]

    def row_indices(self) -> list[int]:
        return [first + i for first, drafts in zip(self.first_rows, self.drafts) for i in range(len(drafts) + 1)]


def _target_probs(logits: torch.Tensor, params: list, rows: list[int]) -> torch.Tensor:
    """The sampled rows' distributions after temperature, min-p, top-k and top-p, normalized, in vocabulary order."""
    probs, order = filtered_probs(logits[rows], *_settings([params[i] for i in rows], logits.shape[-1],
                                                             logits.device))
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, order, probs)


def _uniform(num_rows: int, device, generators: list[torch.Generator | None], shared: torch.Generator):
    u = torch.rand(num_rows, device=device, generator=shared)
    for row, generator in enumerate(generators):
        if generator is not None:
            u[row] = torch.rand(1, device=device, generator=generator)[0]
    return u


def verify(logits: torch.Tensor, rows: VerifyRows, generators: dict[int, torch.Generator], shared: torch.Generator,
           eos_token_ids=()) -> list[list[int]]:
    """logits: fp32 rows of the step, rows.row_indices() among them -> per sequence its accepted drafts and the
    one token that follows them (1..k+1 tokens)."""
    indices = rows.row_indices()
    row_seqs = [seq for seq, drafts in zip(rows.seqs, rows.drafts) for _ in range(len(drafts) + 1)]
    params = [seq.params for seq in row_seqs]
    drafts = torch.tensor([d for ds in rows.drafts for d in [*ds, NO_DRAFT]], device=logits.device)
    logits = logits[torch.tensor(indices, device=logits.device)]
    if any(p.uses_logits_controls for p in params):  # only history-free controls reach here (drafting_allowed)
        logits = apply_logits_controls(logits, params, TokenHistory(row_seqs, eos_token_ids))
    tokens = torch.argmax(logits, dim=-1)
    accepted = drafts == tokens
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        row_generators = [generators.get(row_seqs[i].seq_id) for i in sampled]
        sampled_rows = torch.tensor(sampled, device=logits.device)
        probs = _target_probs(logits, params, sampled)
        row_drafts = drafts[sampled_rows]
        has_draft = row_drafts != NO_DRAFT
        draft_prob = probs.gather(1, row_drafts.clamp(min=0)[:, None])[:, 0]
        u = _uniform(len(sampled), logits.device, row_generators, shared)
        accepted[sampled_rows] = has_draft & (u < draft_prob)
        residual = probs.scatter(1, row_drafts.clamp(min=0)[:, None], 0.0)
        residual = torch.where(has_draft[:, None], residual, probs)
        noise = _race_noise(residual.shape, logits.device, row_generators, shared)
        tokens[sampled_rows] = torch.argmax(residual / noise, dim=-1)
    decided = torch.stack([accepted.long(), tokens]).tolist()
    return _accepted_runs(rows.drafts, *decided)


def _accepted_runs(drafts: list[list[int]], accepted: list[int], tokens: list[int]) -> list[list[int]]:
    """Per sequence: its drafts up to the first rejected one, then the token of that row (or the bonus row)."""
    runs, row = [], 0
    for ds in drafts:
        n = 0
        while n < len(ds) and accepted[row + n]:
            n += 1
        runs.append([*ds[:n], tokens[row + n]])
        row += len(ds) + 1
    return runs
