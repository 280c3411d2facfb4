"""How many pages of the shared KV memory a budget buys, and what they hold (kv_layout says how a page is cut)."""
import math
from dataclasses import dataclass

from atomlite.errors import ConfigError
from atomlite.engine.kv.kv_cache import group_specs
from atomlite.engine.kv.kv_layout import GroupLayout, PageLayout, page_layout
from atomlite.model_ops.kv_spec import KVSpec

SHORTER_LENGTHS = (8192, 2048, 512)  # request lengths the startup report counts besides max_model_len


@dataclass
class KVPlan:
    layout: PageLayout
    num_pages: int  # including the page of null blocks
    budget: int
    max_model_len: int
    block_size: int

    @property
    def groups(self) -> list[GroupLayout]:
        return self.layout.groups

    @property
    def page_bytes(self) -> int:
        return self.layout.page_bytes

    @property
    def max_seqs_at_full_length(self) -> int:
        return self.seqs_that_fit(self.max_model_len)

    def seqs_that_fit(self, seq_len: int) -> int:
        """How many sequences of seq_len tokens the pages hold at once."""
        return self.layout.seqs_that_fit(self.num_pages - 1, seq_len)

    def blocks_per_seq(self, group: GroupLayout, seq_len: int | None = None) -> int:
        return group.spec.blocks_held(seq_len or self.max_model_len, self.block_size)

    def describe(self, seq_len: int | None = None) -> list[str]:
        lines = [f"KV cache: {_size(self.budget)}, {self.num_pages - 1} pages of {_size(self.page_bytes)} shared by {len(self.groups)} groups, block size "
                 f"{self.block_size}, {self.max_seqs_at_full_length} sequences of {self.max_model_len} tokens fit"]
        lengths = sorted({n for n in (*SHORTER_LENGTHS, seq_len) if n and n < self.max_model_len}, reverse=True)
        if lengths:
            counts = ", ".join(f"{self.seqs_that_fit(n)} requests of {n} tokens" for n in lengths)
            lines.append(f"  shorter requests share the pages: {counts} fit at once")
        for i, g in enumerate(self.groups):
            lines.append(f"  group {i}: {g.spec.describe()}, {len(g.layers)} layers, "
                         f"{g.bytes_per_token / 1024:.1f} KiB/token, {g.blocks_per_page} blocks/page, "
                         f"{self.blocks_per_seq(g)} blocks/seq")
        return lines


def _size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes / 2**10:.2f} KiB"


def plan_kv_cache(specs: list[KVSpec], budget: int, block_size: int, max_model_len: int) -> KVPlan:
    grouped, _ = group_specs(specs)
    layout = page_layout(grouped, block_size)
    plan = KVPlan(layout, budget // layout.page_bytes, budget, max_model_len, block_size)
    if plan.num_pages < 2 or plan.max_seqs_at_full_length < 1:
        needed = (_pages_for_one(plan) + 1) * layout.page_bytes
        raise ConfigError(f"KV cache budget {budget / 2**20:.1f} MiB holds no sequence of {max_model_len} tokens "
                          f"(needs {math.ceil(needed / 2**20 * 10) / 10:.1f} MiB): raise --kv-cache-memory or lower "
                          f"--max-model-len")
    return plan


def _pages_for_one(plan: KVPlan) -> int:
    return plan.layout.pages_for([plan.blocks_per_seq(g) for g in plan.groups])


def budget_for(specs: list[KVSpec], block_size: int, max_model_len: int, num_seqs: int) -> int:
    """The bytes that hold num_seqs sequences of max_model_len tokens, plus the page of null blocks."""
    grouped, _ = group_specs(specs)
    layout = page_layout(grouped, block_size)
    blocks = [num_seqs * g.spec.blocks_held(max_model_len, block_size) for g in layout.groups]
    return (layout.pages_for(blocks) + 1) * layout.page_bytes
