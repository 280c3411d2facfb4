"""Split a KV memory budget between groups by what a max-length sequence actually holds in each."""
import math
from dataclasses import dataclass

from atomlite.errors import ConfigError
from atomlite.engine.kv_cache import group_specs
from atomlite.model_ops.kv_spec import KVSpec


@dataclass
class GroupPlan:
    spec: KVSpec
    num_layers: int
    block_bytes: int  # one block across all of the group's layers
    blocks_per_seq: int  # at max_model_len
    num_blocks: int  # including the null block

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.spec.bytes_per_token


@dataclass
class KVPlan:
    groups: list[GroupPlan]
    budget: int
    max_model_len: int
    block_size: int

    @property
    def num_blocks(self) -> list[int]:
        return [g.num_blocks for g in self.groups]

    @property
    def seq_bytes(self) -> int:
        return sum(g.block_bytes * g.blocks_per_seq for g in self.groups)

    @property
    def max_seqs_at_full_length(self) -> int:
        return min((g.num_blocks - 1) // g.blocks_per_seq for g in self.groups)

    def seqs_that_fit(self, seq_len: int) -> int:
        """How many sequences of seq_len tokens the pools hold at once."""
        return min((g.num_blocks - 1) // g.spec.blocks_held(seq_len, self.block_size) for g in self.groups)

    def describe(self) -> list[str]:
        lines = [f"KV cache: {self.budget / 2**30:.2f} GiB, block size {self.block_size}, "
                 f"{self.max_seqs_at_full_length} sequences of {self.max_model_len} tokens fit"]
        for i, g in enumerate(self.groups):
            lines.append(f"  group {i}: {g.spec.describe()}, {g.num_layers} layers, "
                         f"{g.bytes_per_token / 1024:.1f} KiB/token, {g.blocks_per_seq} blocks/seq, "
                         f"{g.num_blocks - 1} blocks ({g.num_blocks * g.block_bytes / 2**30:.2f} GiB)")
        return lines


def plan_kv_cache(specs: list[KVSpec], budget: int, block_size: int, max_model_len: int) -> KVPlan:
    grouped, _ = group_specs(specs)
    groups = []
    for spec, layers in grouped:
        block_bytes = len(layers) * block_size * spec.bytes_per_token
        groups.append(GroupPlan(spec, len(layers), block_bytes, spec.blocks_held(max_model_len, block_size), 0))
    plan = KVPlan(groups, budget, max_model_len, block_size)
    for g in groups:
        share = g.block_bytes * g.blocks_per_seq / plan.seq_bytes
        g.num_blocks = int(budget * share) // g.block_bytes
    if plan.max_seqs_at_full_length < 1:
        raise ConfigError(f"KV cache budget {budget / 2**20:.1f} MiB holds no sequence of {max_model_len} tokens "
                          f"(needs {_budget_for_one(plan) / 2**20:.1f} MiB): raise --kv-cache-memory or lower "
                          f"--max-model-len")
    return plan


def _budget_for_one(plan: KVPlan) -> float:
    """The least budget whose split gives every group one sequence's blocks and its null block, rounded up to the
    0.1 MiB the message shows. Each group gets seq_bytes / (its blocks per sequence) per block it is given."""
    exact = max(plan.seq_bytes * (g.blocks_per_seq + 1) / g.blocks_per_seq for g in plan.groups) + 1
    return math.ceil(exact / 2**20 * 10) / 10 * 2**20
