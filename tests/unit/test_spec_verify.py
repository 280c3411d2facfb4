"""Draft verification keeps the target's distribution exactly (chi-square on a tiny vocabulary), greedy rows accept
exactly the argmax, and the n-gram proposer finds the latest earlier occurrence of the longest suffix."""
import pytest
import torch
from scipy.stats import chisquare

from atomlite.engine.sequence import Sequence
from atomlite.engine.spec.ngram import propose_ngram
from atomlite.engine.spec.stats import SpecStats
from atomlite.engine.spec.verify import VerifyRows, verify
from atomlite.sampling_params import SamplingParams

ROW_LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 0.3],   # decides draft 1
                           [0.0, 1.5, -0.5, 1.0, 0.2, 0.8],   # decides draft 2 (after draft 1 was accepted)
                           [1.0, 0.0, 0.0, 2.0, -2.0, 0.5]])  # the bonus row
DRAFTS = [0, 4]  # a likely first draft, an unlikely second one


def target_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """softmax(l / T) with top_k and top_p applied, written out (rows of ROW_LOGITS have no ties)."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    k = params.top_k if params.top_k > 0 else len(probs)
    covered = 0.0
    for rank, token in enumerate(order.tolist()):
        if rank < k and (rank == 0 or covered < params.top_p):
            keep[token] = True
            covered += float(probs[token])
    p = torch.where(keep, probs, 0)
    return p / p.sum()


def run_many(params: SamplingParams, num: int, seed: int = 0) -> list[list[int]]:
    seqs = [Sequence([1, 2, 3], params) for _ in range(num)]
    logits = ROW_LOGITS.repeat(num, 1)
    rows = VerifyRows(seqs, [3 * i for i in range(num)], [list(DRAFTS)] * num)
    return verify(logits, rows, {}, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4),
                                    SamplingParams(temperature=1.3, top_p=0.85)])
def test_each_output_token_follows_the_target_distribution(params):
    """Token 1 over all runs follows row 0's distribution; token 2, over the runs that accepted draft 1, row 1's;
    token 3, over the runs that accepted both, the bonus row's. Chi-square p-values above 1e-3 (seeded)."""
    runs = run_many(params, 30_000)
    for position in range(3):
        tokens = [run[position] for run in runs if run[:position] == DRAFTS[:position] and len(run) > position]
        want = target_distribution(ROW_LOGITS[position], params)
        counts = torch.bincount(torch.tensor(tokens), minlength=6).double()
        support = want > 0
        assert counts[~support].sum() == 0, (position, counts)
        assert len(tokens) > 500, position
        expected = want[support].double() / want[support].double().sum() * len(tokens)
        result = chisquare(counts[support].numpy(), expected.numpy())
        assert result.pvalue > 1e-3, (position, counts, expected)


def test_greedy_rows_accept_exactly_the_argmax():
    params = SamplingParams(temperature=0.0)
    seqs = [Sequence([1], params) for _ in range(3)]
    # row argmaxes of ROW_LOGITS: 0, 1, 3
    drafts = [[0, 1, 3], [0, 3], [2]]  # all accepted, then the bonus; 0 accepted, 3 rejected; 2 rejected at once
    rows = [0, 1, 2, 0] + [0, 1, 2] + [0, 1]
    logits = ROW_LOGITS[rows]
    first_rows = [0, 4, 7]
    runs = verify(logits, VerifyRows(seqs, first_rows, drafts), {}, torch.Generator().manual_seed(0))
    assert runs == [[0, 1, 3, 0], [0, 1], [0]]


def test_seeded_requests_verify_reproducibly():
    params = SamplingParams(temperature=1.0, seed=3)
    seq = Sequence([1], params)

    def run():
        generators = {seq.seq_id: torch.Generator().manual_seed(3)}
        rows = VerifyRows([seq], [0], [list(DRAFTS)])
        return verify(ROW_LOGITS, rows, generators, torch.Generator().manual_seed(int(torch.randint(99, (1,)))))

    assert all(run() == run() for _ in range(5))


@pytest.mark.parametrize("tokens,k,expected", [
    ([1, 2, 3, 9, 1, 2, 3], 3, [9, 1, 2]),          # the 3-gram 1 2 3 occurred before: what followed it
    ([1, 2, 3, 9, 7, 2, 3, 5, 2, 3], 2, [5, 2]),     # the latest occurrence of the longest suffix wins
    ([4, 5, 6, 7], 3, []),                          # nothing repeats
    ([5, 5], 4, [5]),                               # what follows can run up to the end
])
def test_ngram_proposals(tokens, k, expected):
    assert propose_ngram(tokens, k, 1, 3) == expected


def test_ngram_prefers_the_longest_match():
    tokens = [7, 8, 1, 4, 8, 1, 2, 0, 8, 1]  # 1 alone last followed 2..., "8 1" too: n = 2 matches at index 4
    assert propose_ngram(tokens, 2, 1, 3) == [2, 0]
    assert propose_ngram(tokens, 2, 3, 3) == []


def test_acceptance_counters():
    stats = SpecStats(3)
    stats.record([[1, 2, 3], [4, 5], [6, 7, 8]], [[1, 2, 9], [0], [6, 7, 8, 1]])
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 5)
    assert stats.accepted_per_pos == [2, 2, 1]
    assert stats.mean_acceptance_length == pytest.approx(1 + 5 / 3)
