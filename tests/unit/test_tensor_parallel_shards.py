"""Shard arithmetic of tensor parallelism: equal splits, KV heads replicated where fewer than the ranks, MXFP4
blocks, and the errors that name what cannot be split."""
import pytest
import torch
from torch import nn

from atomlite.distributed import Shard, TensorParallel, kv_heads_of_rank, split
from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import PartialSums, RankPartials
from atomlite.model_ops.linear import Linear, RowParallelLinear
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.sharding import ReducesOutput, reduced


def test_split_gives_each_rank_its_equal_part():
    assert [split(12, rank, 3, "x") for rank in range(3)] == [Shard(0, 4, 12), Shard(4, 4, 12), Shard(8, 4, 12)]
    assert split(12, 0, 1, "x").whole


def test_uneven_split_names_the_dimension_and_the_size():
    with pytest.raises(ConfigError, match="intermediate_size = 10 is not divisible by the tensor-parallel size 4"):
        split(10, 0, 4, "intermediate_size")


@pytest.mark.parametrize("num_kv_heads, size, expected", [
    (8, 4, [Shard(0, 2, 8), Shard(2, 2, 8), Shard(4, 2, 8), Shard(6, 2, 8)]),
    (4, 8, [Shard(r // 2, 1, 4) for r in range(8)]),  # 31B's global layers at TP=8: each KV head on two ranks
    (1, 2, [Shard(0, 1, 1)] * 2)])
def test_kv_heads_split_or_replicated_to_the_head_each_ranks_queries_read(num_kv_heads, size, expected):
    assert [kv_heads_of_rank(num_kv_heads, 32, rank, size, "kv") for rank in range(size)] == expected


def test_kv_heads_that_a_ranks_queries_would_straddle_are_refused():
    with pytest.raises(ConfigError, match="num_key_value_heads = 2 is fewer than the tensor-parallel size 3"):
        kv_heads_of_rank(2, 6, 0, 3, "num_key_value_heads")


def test_mxfp4_shards_must_fall_on_32_element_blocks():
    assert Shard(64, 64, 128).in_blocks(32, "down_proj") == Shard(2, 2, 4)
    with pytest.raises(ConfigError, match="down_proj: the shard \\[48, 96\\) of 96 does not fall on 32-element"):
        Shard(48, 48, 96).in_blocks(32, "down_proj")


class _Peers:
    """The group's peer memory as a row-parallel layer sees it: takes each share or none; its all-reduce doubles x
    (two ranks holding the same share)."""
    hands_over_rank_partials = True

    def __init__(self, takes: bool):
        self.takes = takes

    def takes_rank_partials(self, rows: int, dim: int, element_size: int) -> bool:
        return self.takes

    def hand_over(self, parts):
        return tuple(RankPartials(p, "channel") for p in parts) if self.takes else None

    def serves(self, x):
        return True

    def all_reduce(self, x):
        return 2 * x


class _Product(nn.Module):
    """A product whose kernel splits K in two: returns the slices where told to (returns_partial_sums)."""
    out_features = 4

    def __init__(self):
        super().__init__()
        self.returns_partial_sums = False

    def forward(self, x):
        parts = torch.stack([x, 3 * x])
        return PartialSums(parts, x.dtype) if self.returns_partial_sums else parts.sum(0)

    def can(self, capability: str) -> bool:
        return capability == "writes_partial_sums"

    def link_consumer(self, consumer, forms: set[str]) -> None:
        self.returns_partial_sums = "partial_sums" in forms


class _Share(ReducesOutput, _Product):
    """_Product holding a slice of its input dim."""


def test_a_row_parallel_linear_hands_on_partial_sums_only_inside_rank_partials():
    """Its split-K slices would reach the next kernel before the all-reduce: fusion links them only where the layer
    hands its share over as RankPartials, which the group's peer memory does and a plain group does not."""
    with dispatch.use(Platform("cuda", "sm_90"), "triton"):
        plain, alone = Linear(64, 8), RowParallelLinear(32, 8, tp=TensorParallel(0, 2))
        handing = RowParallelLinear(32, 8, tp=TensorParallel(0, 2, peers=_Peers(True)))
    assert plain.can("writes_partial_sums") and not alone.can("writes_partial_sums")
    assert handing.can("writes_partial_sums") and handing.can("writes_rank_partials")
    handing.link_consumer(None, {"partial_sums"})  # a consumer that reads PartialSums but not RankPartials
    assert not handing.shares_partial_sums and not handing.returns_partial_sums


@pytest.mark.parametrize("takes", [True, False], ids=["the exchange takes the call", "it does not"])
def test_a_share_stays_split_k_slices_only_for_a_call_the_exchange_takes(takes):
    x = torch.randn(2, 4)
    layer = _Share(tp=TensorParallel(0, 2, peers=_Peers(takes)))
    layer.link_consumer(None, {"partial_sums", "rank_partials"})
    assert layer.shares_partial_sums and not layer.returns_partial_sums
    out = layer(x)
    if takes:
        assert isinstance(out, RankPartials) and isinstance(out.part, PartialSums)
        assert torch.equal(out.part.parts, torch.stack([x, 3 * x]))
    else:  # summed by the layer's kernel, then all-reduced
        assert not layer.returns_partial_sums and torch.equal(out, 2 * (4 * x))


def test_shares_left_as_slices_for_a_hand_over_that_does_not_come_are_summed_before_the_all_reduce():
    x = torch.randn(2, 4)
    tp = TensorParallel(0, 2, peers=_Peers(False))
    (y,) = reduced(tp, PartialSums(torch.stack([x, x]), x.dtype), hand_over=True)
    assert torch.equal(y, 2 * (x + x))


def test_collectives_of_a_single_process_return_their_input():
    x = torch.randn(3, 4)
    assert TensorParallel().all_reduce(x) is x and TensorParallel().all_gather_last(x) is x
