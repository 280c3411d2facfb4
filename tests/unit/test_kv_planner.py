"""The KV planner (behind `atomlite plan` and the engine's cache sizing) on its own: how many pages a budget buys
and how they are cut for each group, how many sequences of a length that holds, and the error when none fits; and
the memory split that sets the budget on a GPU."""
import re

import pytest
import torch

from atomlite.engine.kv.kv_planner import budget_for, plan_kv_cache
from atomlite.engine.kv.memory_profile import MemoryProfile
from atomlite.errors import ConfigError
from atomlite.model_ops.kv_spec import KVSpec

BLOCK = 4
FULL = KVSpec("full", 1, 4, torch.float32)  # 32 bytes a token a layer
SLIDING = KVSpec("sliding", 1, 4, torch.float32, window=4)
BLOCK_BYTES = 2 * BLOCK * FULL.bytes_per_token  # one block of a two-layer group
MiB = 2**20


def test_planner_reports_max_sequences_for_a_budget():
    """Two full layers, 16 tokens a sequence: 4 blocks of 256 bytes each, plus the page of null blocks."""
    enough = plan_kv_cache([FULL, FULL], BLOCK_BYTES * (3 * 4 + 1), BLOCK, max_model_len=16)
    assert enough.num_pages == 13 and enough.page_bytes == BLOCK_BYTES and enough.max_seqs_at_full_length == 3
    assert "3 sequences of 16 tokens fit" in enough.describe()[0]
    short = plan_kv_cache([FULL, FULL], BLOCK_BYTES * (3 * 4 + 1) - 1, BLOCK, max_model_len=16)
    assert short.max_seqs_at_full_length == 2


def test_groups_draw_on_one_pool_so_short_sequences_fit_by_what_they_hold():
    """At 32 tokens a full layer holds 8 blocks and a window-4 layer 2; at 4 tokens both hold 1. A split by
    max-length sequences would give the sliding group a fifth of the pages and fit 20 short sequences, not 49."""
    plan = plan_kv_cache([FULL, SLIDING, FULL, SLIDING], BLOCK_BYTES * 100, BLOCK, max_model_len=32)
    assert [(g.spec, len(g.layers), plan.blocks_per_seq(g)) for g in plan.groups] == [(FULL, 2, 8), (SLIDING, 2, 2)]
    assert plan.num_pages == 100 and plan.max_seqs_at_full_length == 99 // 10
    assert plan.seqs_that_fit(4) == 99 // 2
    assert "49 requests of 4 tokens fit at once" in plan.describe(seq_len=4)[1]


def test_smaller_blocks_share_pages():
    """A V-only group's blocks are half the size of the K+V group's: two fit in a page, and sequences fill them."""
    v_only = KVSpec("full", 1, 4, torch.float32, k_from_v=True)
    plan = plan_kv_cache([FULL, FULL, v_only, v_only], BLOCK_BYTES * 31, BLOCK, max_model_len=16)
    assert [g.blocks_per_page for g in plan.groups] == [1, 2]
    assert plan.max_seqs_at_full_length == 5  # 4 pages and 2 half pages each: 30 pages hold 5, not 30 / 8 = 3


@pytest.mark.parametrize("budget", [BLOCK_BYTES * 40, BLOCK_BYTES * 77 + 255, 10**6 + 1])
def test_planner_never_plans_more_than_its_budget(budget):
    plan = plan_kv_cache([FULL, SLIDING, KVSpec("full", 2, 8, torch.bfloat16)], budget, BLOCK, max_model_len=32)
    assert plan.num_pages * plan.page_bytes <= budget
    assert all(g.block_bytes <= g.block_stride and g.block_stride * g.blocks_per_page == plan.page_bytes
               for g in plan.groups)
    assert plan.max_seqs_at_full_length >= 1


def test_shorter_sequences_fit_in_greater_numbers():
    plan = plan_kv_cache([FULL, SLIDING], BLOCK_BYTES * 200, BLOCK, max_model_len=64)
    assert plan.seqs_that_fit(64) == plan.max_seqs_at_full_length
    assert plan.seqs_that_fit(4) == (plan.num_pages - 1) // 2 > plan.max_seqs_at_full_length


def test_shared_layers_cost_no_kv_memory():
    owners = plan_kv_cache([FULL, SLIDING], BLOCK_BYTES * 50, BLOCK, max_model_len=32)
    shared = plan_kv_cache([FULL, SLIDING, KVSpec("shared", target=0), KVSpec("shared", target=1)],
                           BLOCK_BYTES * 50, BLOCK, max_model_len=32)
    assert (shared.num_pages, shared.page_bytes) == (owners.num_pages, owners.page_bytes)


def test_k_from_v_layers_fit_twice_the_tokens():
    v_only = KVSpec("full", 1, 4, torch.float32, k_from_v=True)
    both = plan_kv_cache([FULL, FULL], BLOCK_BYTES * 41, BLOCK, max_model_len=16)
    halved = plan_kv_cache([v_only, v_only], BLOCK_BYTES * 41, BLOCK, max_model_len=16)
    assert (both.max_seqs_at_full_length, halved.max_seqs_at_full_length) == (10, 20)


def test_budget_for_holds_exactly_that_many_sequences():
    specs = [FULL, SLIDING, KVSpec("full", 2, 8, torch.bfloat16, k_from_v=True)]
    for seqs in (1, 3, 7):
        assert plan_kv_cache(specs, budget_for(specs, BLOCK, 32, seqs), BLOCK, 32).max_seqs_at_full_length == seqs


def test_planner_rejects_max_model_len_over_budget_with_clear_message():
    with pytest.raises(ConfigError) as err:
        plan_kv_cache([FULL, SLIDING], 16 * MiB, 16, max_model_len=2**20)
    message = str(err.value)
    assert "16.0 MiB" in message and "1048576 tokens" in message
    assert "--kv-cache-memory" in message and "--max-model-len" in message


def test_budget_the_error_names_as_needed_is_enough():
    full = KVSpec("full", 8, 256, torch.bfloat16)
    sliding = KVSpec("sliding", 8, 256, torch.bfloat16, window=1024)
    specs = [sliding] * 5 + [full]
    with pytest.raises(ConfigError) as err:
        plan_kv_cache(specs, MiB, 16, max_model_len=8192)
    need = float(re.search(r"needs ([\d.]+) MiB", str(err.value)).group(1))
    plan = plan_kv_cache(specs, int((need + 0.05) * MiB), 16, max_model_len=8192)  # .1f rounds by up to 0.05
    assert plan.max_seqs_at_full_length == 1


def test_kv_budget_is_what_gpu_memory_utilization_leaves():
    GiB = 2**30
    profile = MemoryProfile(total=80 * GiB, utilization=0.9, weights=30 * GiB, prefill_peak=4 * GiB,
                            graphs=GiB, outside_torch=GiB)
    assert profile.kv_budget == 36 * GiB
    assert "KV cache 36.00 GiB" in profile.describe()
    starved = MemoryProfile(80 * GiB, 0.5, 30 * GiB, 10 * GiB, GiB, GiB)
    assert starved.kv_budget < 0 and "KV cache 0.00 GiB" in starved.describe()


def test_the_vision_towers_graph_pool_comes_out_of_the_kv_budget():
    GiB = 2**30
    profile = MemoryProfile(total=80 * GiB, utilization=0.9, weights=30 * GiB, prefill_peak=4 * GiB, graphs=GiB,
                            outside_torch=GiB, encoder_cache=GiB, encoder_peak=2 * GiB, encoder_graphs=2 * GiB)
    assert profile.kv_budget == 33 * GiB
    assert "vision tower graphs 2.00 GiB" in profile.describe()


def test_the_audio_towers_graph_pool_comes_out_of_the_kv_budget():
    GiB = 2**30
    profile = MemoryProfile(total=80 * GiB, utilization=0.9, weights=30 * GiB, prefill_peak=4 * GiB, graphs=GiB,
                            outside_torch=GiB, encoder_graphs=2 * GiB, audio_graphs=GiB)
    assert profile.kv_budget == 33 * GiB
    assert "vision tower graphs 2.00 GiB, audio tower graphs 1.00 GiB" in profile.describe()
