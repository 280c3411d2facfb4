"""docs/KV_CACHE.md's numbers are the planner's: its first table (`atomlite plan` at --max-model-len 32768 in
100 GiB, bf16) and the bytes one 32k-token 31B sequence holds, recomputed from the real configs on the meta device."""
import re
from pathlib import Path

import pytest

from atomlite.config import EngineConfig
from atomlite.model_ops.platform import Platform
from atomlite.plan import plan_report

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "KV_CACHE.md").read_text()
ROW = re.compile(r"^\| (gemma-4-[\w-]+) \| ([\d.]+) GiB \| (\d+) layers, \d+x\d+, ([\d.]+) KiB/token.*?\| "
                 r"(\d+) layers, \d+x\d+,.*?([\d.]+) KiB/token.*\| (\d+) \| (\d+) \|$", re.M)


def planned(name: str):
    config = EngineConfig(model=str(ROOT / "examples" / "configs" / name), max_model_len=32768)
    return plan_report(config, 100 * 2**30, Platform())


def test_the_table_lists_every_model_once():
    assert [m.group(1) for m in ROW.finditer(DOC)] == ["gemma-4-31B-it", "gemma-4-26B-A4B-it", "gemma-4-E2B-it"]


@pytest.mark.parametrize("row", list(ROW.finditer(DOC)), ids=lambda m: m.group(1))
def test_each_row_is_what_plan_prints(row):
    name, weights, sliding_layers, sliding_kib, full_layers, full_kib, long_seqs, short_seqs = row.groups()
    lines, plan = planned(name)
    assert f"weights {weights} GiB" in "\n".join(lines)
    sliding, full = sorted(plan.groups, key=lambda g: g.spec.kind != "sliding")
    assert (len(sliding.layers), sliding.bytes_per_token / 1024) == (int(sliding_layers), float(sliding_kib))
    assert (len(full.layers), full.bytes_per_token / 1024) == (int(full_layers), float(full_kib))
    assert (plan.max_seqs_at_full_length, plan.seqs_that_fit(2048)) == (int(long_seqs), int(short_seqs))


def test_a_32k_sequence_of_31b_holds_what_the_page_says():
    held, with_k = re.search(r"A 32k-token sequence of 31B holds ([\d.]+) GiB.*?; ([\d.]+) GiB if K were stored",
                             DOC, re.S).groups()
    _, plan = planned("gemma-4-31B-it")
    stored = sum(plan.blocks_per_seq(g) * g.block_bytes for g in plan.groups)
    full = next(g for g in plan.groups if g.spec.kind == "full")
    assert full.spec.k_from_v
    k_too = stored + plan.blocks_per_seq(full) * full.block_bytes  # V alone: K's bytes would equal V's
    assert (f"{stored / 2**30:.2f}", f"{k_too / 2**30:.2f}") == (held, with_k)
