"""`atomlite plan --tensor-parallel-size N`: weights and the KV plan are each rank's, from config.json alone."""
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from atomlite.cli import main
from atomlite.config import EngineConfig
from atomlite.model_ops.platform import Platform
from atomlite.plan import meta_model, weight_bytes

GEMMA_31B = str(Path(__file__).parents[2] / "examples" / "configs" / "gemma-4-31B-it")


def plan(*flags: str):
    return CliRunner().invoke(main, ["plan", "--model", GEMMA_31B, *flags])


def weights_gib(output: str) -> float:
    return float(re.search(r"weights ([\d.]+) GiB", output).group(1))


def sequences_fitting(output: str) -> int:
    return int(re.search(r"(\d+) sequences of \d+ tokens fit", output).group(1))


def test_two_ranks_each_hold_half_the_weights_and_fit_more_sequences_in_the_same_budget():
    whole, shard = plan("--kv-cache-memory", "20GiB"), plan("--kv-cache-memory", "20GiB", "-tp", "2")
    assert whole.exit_code == 0 and shard.exit_code == 0, whole.output + shard.output
    assert "tensor parallel: 2 ranks; weights and KV cache below are each rank's" in shard.stdout
    assert "per rank" in shard.stdout and "tensor parallel" not in whole.stdout
    assert weights_gib(shard.stdout) == pytest.approx(weights_gib(whole.stdout) / 2, rel=0.01)
    assert sequences_fitting(shard.stdout) >= 2 * sequences_fitting(whole.stdout)  # half the KV heads per rank


@pytest.mark.parametrize("size", [2, 8])  # 8: more ranks than the 4 global KV heads, which are then replicated
def test_every_rank_needs_what_rank_0_needs(size):
    config = EngineConfig(model=GEMMA_31B, device="cpu", tensor_parallel_size=size)
    rank_0, last = (meta_model(config, Platform(), rank=r) for r in (0, size - 1))
    assert last.kv_specs(torch.bfloat16) == rank_0.kv_specs(torch.bfloat16)
    assert weight_bytes(last) == weight_bytes(rank_0)


@pytest.mark.parametrize("flags,line", [
    (["--platform", "gfx942+aiter"], "all-reduce: aiter custom all-reduce in graphs (aiter on gfx942), rccl"),
    (["--platform", "gfx950"], "all-reduce: rccl alone (no backend implements custom_all_reduce here (triton: not "
                               "verified on ROCm"),
    (["--platform", "sm_90"], "all-reduce: triton custom all-reduce in graphs (triton on cuda), nccl"),
    (["--platform", "cpu"], "all-reduce: gloo alone (no backend implements custom_all_reduce here (torch: no "
                            "reference"),
])
def test_the_plan_says_which_all_reduce_the_group_would_use(flags, line):
    result = plan("-tp", "2", *flags)
    assert result.exit_code == 0, result.output
    assert line in result.stdout


def test_a_size_that_does_not_divide_the_heads_is_one_line_naming_the_config_key():
    result = plan("--tensor-parallel-size", "64")  # divides vocab_size and the hidden sizes, not 32 query heads
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: num_attention_heads = 32") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_tensor_parallel_size_0_is_one_line_naming_the_flag():
    result = plan("--tensor-parallel-size", "0")
    assert result.exit_code == 2 and result.stderr.startswith("error: --tensor-parallel-size 0"), result.output


def test_planning_for_more_gpus_than_this_machine_has_needs_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = plan("-tp", "8", "--platform", "gfx950")
    assert result.exit_code == 0, result.output
    assert "tensor parallel: 8 ranks" in result.stdout
