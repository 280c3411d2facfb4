"""The KV planner (behind `atomlite plan` and the engine's cache sizing) on its own: how many blocks each group
gets for a budget, how many sequences that holds, and the error when none fits; and the memory split that sets
the budget on a GPU."""
import re

import pytest
import torch

from atomlite.engine.kv_planner import plan_kv_cache
from atomlite.engine.memory_profile import MemoryProfile
from atomlite.errors import ConfigError
from atomlite.model_ops.kv_spec import KVSpec

BLOCK = 4
FULL = KVSpec("full", 1, 4, torch.float32)  # 32 bytes a token a layer
SLIDING = KVSpec("sliding", 1, 4, torch.float32, window=4)
BLOCK_BYTES = 2 * BLOCK * FULL.bytes_per_token  # one block of a two-layer group
MiB = 2**20


def test_planner_reports_max_sequences_for_a_budget():
    """Two full layers, 16 tokens a sequence: 4 blocks of 256 bytes each, plus the null block."""
    enough = plan_kv_cache([FULL, FULL], BLOCK_BYTES * (3 * 4 + 1), BLOCK, max_model_len=16)
    assert enough.num_blocks == [13] and enough.max_seqs_at_full_length == 3
    assert "3 sequences of 16 tokens fit" in enough.describe()[0]
    short = plan_kv_cache([FULL, FULL], BLOCK_BYTES * (3 * 4 + 1) - 1, BLOCK, max_model_len=16)
    assert short.max_seqs_at_full_length == 2


def test_planner_splits_the_budget_by_what_a_max_length_sequence_holds_in_each_group():
    """At 32 tokens a full layer holds 8 blocks and a window-4 layer 2, so the full group gets 4 times the blocks."""
    plan = plan_kv_cache([FULL, SLIDING, FULL, SLIDING], BLOCK_BYTES * 100, BLOCK, max_model_len=32)
    assert [(g.spec, g.num_layers, g.blocks_per_seq) for g in plan.groups] == [(FULL, 2, 8), (SLIDING, 2, 2)]
    assert plan.num_blocks == [80, 20]


@pytest.mark.parametrize("budget", [BLOCK_BYTES * 40, BLOCK_BYTES * 77 + 255, 10**6 + 1])
def test_planner_never_plans_more_than_its_budget(budget):
    plan = plan_kv_cache([FULL, SLIDING, KVSpec("full", 2, 8, torch.bfloat16)], budget, BLOCK, max_model_len=32)
    assert sum(g.num_blocks * g.block_bytes for g in plan.groups) <= budget
    assert plan.max_seqs_at_full_length >= 1


def test_shorter_sequences_fit_in_greater_numbers():
    plan = plan_kv_cache([FULL, SLIDING], BLOCK_BYTES * 200, BLOCK, max_model_len=64)
    assert plan.seqs_that_fit(64) == plan.max_seqs_at_full_length
    assert plan.seqs_that_fit(4) == min(n - 1 for n in plan.num_blocks) > plan.max_seqs_at_full_length


def test_shared_layers_cost_no_kv_memory():
    owners = plan_kv_cache([FULL, SLIDING], BLOCK_BYTES * 50, BLOCK, max_model_len=32)
    shared = plan_kv_cache([FULL, SLIDING, KVSpec("shared", target=0), KVSpec("shared", target=1)],
                           BLOCK_BYTES * 50, BLOCK, max_model_len=32)
    assert shared.num_blocks == owners.num_blocks and shared.seq_bytes == owners.seq_bytes


def test_k_from_v_layers_fit_twice_the_tokens():
    v_only = KVSpec("full", 1, 4, torch.float32, k_from_v=True)
    both = plan_kv_cache([FULL, FULL], BLOCK_BYTES * 41, BLOCK, max_model_len=16)
    halved = plan_kv_cache([v_only, v_only], BLOCK_BYTES * 41, BLOCK, max_model_len=16)
    assert (both.max_seqs_at_full_length, halved.max_seqs_at_full_length) == (10, 20)


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
