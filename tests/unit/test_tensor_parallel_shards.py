"""Shard arithmetic of tensor parallelism: equal splits, KV heads replicated where fewer than the ranks, MXFP4
blocks, and the errors that name what cannot be split."""
import pytest
import torch

from atomlite.distributed import Shard, TensorParallel, kv_heads_of_rank, split
from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.linear import Linear, RowParallelLinear
from atomlite.model_ops.platform import Platform


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


def test_a_row_parallel_linear_never_hands_on_partial_sums():
    """Its split-K slices would reach the next kernel before the all-reduce: fusion must not link them."""
    with dispatch.use(Platform("cuda", "sm_90"), "triton"):
        plain, sharded = Linear(64, 8), RowParallelLinear(32, 8, tp=TensorParallel(0, 2))
    assert plain.can("writes_partial_sums") and not sharded.can("writes_partial_sums")


def test_collectives_of_a_single_process_return_their_input():
    x = torch.randn(3, 4)
    assert TensorParallel().all_reduce(x) is x and TensorParallel().all_gather_last(x) is x
