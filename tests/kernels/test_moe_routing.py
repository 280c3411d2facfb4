"""Grouping (token, slot) pairs by expert into tiles (triton.moe_routing; on CPU under TRITON_INTERPRET=1)
against a plain-Python layout of the same tiles."""
import pytest
import torch

from atomlite.model_ops.triton.moe.routing import ONE_PROGRAM_MAX_PAIRS, group_by_expert, max_tiles

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def expected_tiles(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[list, list, list]:
    """(pairs per used row, expert per used tile, used rows per used tile): experts in order, pairs in order."""
    flat = topk_ids.reshape(-1).tolist()
    rows, experts, counts = [], [], []
    for e in range(num_experts):
        pairs = [p for p, expert in enumerate(flat) if expert == e]
        for start in range(0, len(pairs), block_m):
            chunk = pairs[start:start + block_m]
            rows.append(chunk)
            experts.append(e)
            counts.append(len(chunk))
    return rows, experts, counts


def assert_tiles_match(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    tiles = group_by_expert(topk_ids.to(DEVICE), num_experts, block_m)
    want_rows, want_experts, want_counts = expected_tiles(topk_ids, num_experts, block_m)
    used = len(want_experts)
    assert tiles.max_tiles == max_tiles(topk_ids.numel(), num_experts, block_m) >= used
    expert, rows = tiles.tile_expert.cpu().tolist(), tiles.tile_rows.cpu().tolist()
    assert expert == want_experts + [-1] * (tiles.max_tiles - used)
    assert rows == want_counts + [0] * (tiles.max_tiles - used)
    pair_of_row = tiles.pair_of_row.cpu().view(tiles.max_tiles, block_m)
    assert [pair_of_row[t, :n].tolist() for t, n in enumerate(want_counts)] == want_rows


def random_ids(tokens: int, top_k: int, num_experts: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)])


@pytest.mark.parametrize("tokens,top_k,num_experts,block_m", [
    (1, 1, 4, 16),      # one token, one expert
    (1, 8, 128, 16),    # decode at 26B-A4B's routing
    (5, 2, 4, 4),       # experts fill several tiles, the last one partly
    (13, 3, 6, 8),      # experts not a power of two
    (32, 8, 128, 16),   # decode batch 32: one program, four chunks
    (70, 8, 16, 64),    # 560 pairs: counted by one launch, placed by another
])
def test_tiles_group_pairs_by_expert_in_pair_order(tokens, top_k, num_experts, block_m):
    assert_tiles_match(random_ids(tokens, top_k, num_experts, seed=tokens), num_experts, block_m)


def test_uneven_routing_with_experts_that_get_no_token():
    ids = torch.tensor([[3, 0], [3, 5], [3, 0], [3, 5], [3, 0], [3, 7]])  # experts 1, 2, 4, 6 get nothing
    assert_tiles_match(ids, 8, 4)


def test_placing_programs_read_the_chunk_counts_several_rows_a_step(monkeypatch):
    """560 pairs, 9 chunks of 16 experts read 4 a step: the last step partial."""
    from atomlite.model_ops.triton.moe import routing
    monkeypatch.setattr(routing, "COUNT_ELEMENTS", 64)
    assert_tiles_match(random_ids(70, 8, 16, seed=3), 16, 64)


def test_every_pair_on_one_expert_over_the_one_program_limit():
    tokens = ONE_PROGRAM_MAX_PAIRS // 2 + 3
    ids = torch.stack([torch.full((tokens,), 5), torch.arange(tokens) % 3], dim=1)
    assert_tiles_match(ids, 8, 16)


def _compositions(total: int, parts: int):
    """Every way to split `total` pairs over `parts` experts."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _compositions(total - first, parts - 1):
            yield (first,) + rest


@pytest.mark.parametrize("num_experts,block_m", [(1, 4), (3, 4), (4, 8), (6, 2)])
def test_tile_bound_is_the_most_tiles_any_routing_needs(num_experts, block_m):
    for pairs in range(1, 14):
        worst = max(sum(-(-c // block_m) for c in counts) for counts in _compositions(pairs, num_experts))
        assert max_tiles(pairs, num_experts, block_m) == worst, pairs
