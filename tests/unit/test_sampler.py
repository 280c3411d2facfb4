"""The batched sampler draws from the filtered distribution each row asks for, keeps seeded rows independent of
the batch, and copies the chosen ids to the host once."""
import pytest
import torch

from atomlite.engine.sampling.sampler import filtered_probs, sample_ids
from atomlite.sampling_params import SamplingParams

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def expected(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution written out by hand: softmax(l / T), top_k most likely, then the smallest top_p prefix."""
    probs = torch.softmax(LOGITS / temperature, dim=0)  # LOGITS are sorted already
    keep = torch.zeros(5, dtype=torch.bool)
    keep[:top_k] = True
    covered = torch.cumsum(torch.where(keep, probs, 0), 0) - probs
    keep &= covered < top_p * probs[keep].sum()
    keep[0] = True
    p = torch.where(keep, probs, 0)
    return p / p.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, 1.0), (0.5, 5, 1.0), (2.0, 3, 1.0),
                                                     (1.0, 5, 0.8), (1.5, 4, 0.9)])
def test_filtered_probs_match_the_written_out_distribution(temperature, top_k, top_p):
    probs, order = filtered_probs(LOGITS[None], torch.tensor([temperature]), torch.tensor([top_k]),
                                  torch.tensor([top_p]))
    got = torch.zeros(5).scatter(0, order[0], probs[0] / probs[0].sum())
    torch.testing.assert_close(got, expected(temperature, top_k, top_p), atol=1e-6, rtol=1e-5)


def test_sampled_frequencies_follow_each_rows_distribution():
    """Rows with different settings in one batch, 40,000 draws: frequencies within 4 standard errors."""
    settings = [(1.0, -1, 1.0), (0.5, 3, 1.0), (1.5, -1, 0.8), (0.0, -1, 1.0)]  # the last is greedy
    params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in settings]
    draws = 40_000
    counts = torch.zeros(len(params), 5)
    shared = torch.Generator().manual_seed(0)
    for _ in range(draws // 100):
        logits = LOGITS.repeat(len(params) * 100, 1)
        tokens = sample_ids(logits, params * 100, [None] * len(params) * 100, shared).view(100, -1)
        for row in range(len(params)):
            counts[row] += torch.bincount(tokens[:, row], minlength=5)
    for row, (t, k, p) in enumerate(settings):
        want = expected(t, k if k > 0 else 5, p) if t > 0 else torch.tensor([1.0, 0, 0, 0, 0])
        freq = counts[row] / draws
        assert ((freq - want).abs() <= 4 * (want * (1 - want) / draws).sqrt() + 1e-9).all(), (row, freq, want)


def test_seeded_rows_do_not_depend_on_the_batch():
    params = SamplingParams(temperature=1.0, seed=7)
    logits = torch.randn(6, 50)

    def draw(rows: int) -> int:
        generators = [torch.Generator().manual_seed(7)] + [None] * (rows - 1)
        batch = torch.cat([logits[:1], torch.randn(rows - 1, 50)])
        return sample_ids(batch, [params] * rows, generators, torch.Generator().manual_seed(rows)).tolist()[0]

    assert draw(1) == draw(3) == draw(6)


def test_one_host_copy_for_the_whole_batch(monkeypatch):
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or original(self))
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_p=0.9, seed=1)]
    ids = sample_ids(torch.randn(2, 30), params, [None, torch.Generator().manual_seed(1)], torch.Generator())
    tokens = ids.tolist()
    assert len(tokens) == 2 and len(calls) == 1
