"""Per-layer heterogeneous paged KV cache.

Layers with equal KVSpecs form a group; each group has its own block pool, its own cache tensors (one K and one V
per owning layer, [num_blocks, block_size, kv_heads, head_dim]) and its own block table per sequence. Sliding
groups release blocks that fell out of the window; shared layers own nothing and read their target's cache.
"""
import math
from dataclasses import dataclass

import torch

from atomlite.engine.block_pool import NULL_BLOCK, BlockPool
from atomlite.engine.kv_spec import KVSpec
from atomlite.engine.sequence import Sequence


@dataclass
class KVGroup:
    id: int
    spec: KVSpec
    layers: list[int]
    pool: BlockPool

    def first_needed_block(self, first_query_pos: int, block_size: int) -> int:
        """Logical blocks before this one hold no key a query at >= first_query_pos can see."""
        if self.spec.kind != "sliding":
            return 0
        return max(0, first_query_pos - self.spec.window + 1) // block_size


def group_specs(specs: list[KVSpec]) -> tuple[list[tuple[KVSpec, list[int]]], dict[int, int]]:
    """-> [(spec, owning layers)] in first-seen order, and layer -> index into that list (shared layers too)."""
    groups: dict[tuple, tuple[KVSpec, list[int]]] = {}
    layer_group: dict[int, int] = {}
    for layer, spec in enumerate(specs):
        if spec.kind == "shared":
            continue
        entry = groups.setdefault(spec.group_key, (spec, []))
        entry[1].append(layer)
        layer_group[layer] = list(groups).index(spec.group_key)
    for layer, spec in enumerate(specs):
        if spec.kind == "shared":
            if specs[spec.target].kind == "shared":
                raise ValueError(f"layer {layer} shares layer {spec.target}'s KV, which itself owns none")
            layer_group[layer] = layer_group[spec.target]
    return list(groups.values()), layer_group


class KVCacheManager:
    def __init__(self, specs: list[KVSpec], num_blocks: list[int], block_size: int, device: torch.device,
                 enable_prefix_caching: bool = True):
        grouped, self.layer_group = group_specs(specs)
        self.specs = specs
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.groups = [KVGroup(i, spec, layers, BlockPool(n))
                       for i, ((spec, layers), n) in enumerate(zip(grouped, num_blocks))]
        self.caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for group in self.groups:
            shape = (group.pool.num_blocks, block_size, group.spec.num_kv_heads, group.spec.head_dim)
            for layer in group.layers:
                self.caches[layer] = (torch.zeros(shape, dtype=group.spec.dtype, device=device),
                                      torch.zeros(shape, dtype=group.spec.dtype, device=device))

    def cache_for_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        spec = self.specs[layer]
        owner = spec.target if spec.kind == "shared" else layer
        k, v = self.caches[owner]
        return k, v, self.layer_group[layer]

    # -- allocation ---------------------------------------------------------------------------------------
    def _new_blocks_needed(self, seq: Sequence, group: KVGroup, num_new_tokens: int) -> int:
        total_blocks = math.ceil((seq.num_computed_tokens + num_new_tokens) / self.block_size)
        table = seq.block_tables[group.id]
        first = group.first_needed_block(seq.num_computed_tokens, self.block_size)
        return total_blocks - max(len(table), first)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        self._ensure_tables(seq)
        return all(self._new_blocks_needed(seq, g, num_new_tokens) <= g.pool.num_free for g in self.groups)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give seq the blocks for its next num_new_tokens in every group; all or nothing."""
        if not self.can_allocate(seq, num_new_tokens):
            return False
        for group in self.groups:
            table = seq.block_tables[group.id]
            first = group.first_needed_block(seq.num_computed_tokens, self.block_size)
            table.extend([NULL_BLOCK] * max(0, first - len(table)))
            table.extend(group.pool.allocate() for _ in range(self._new_blocks_needed(seq, group, num_new_tokens)))
        return True

    def free(self, seq: Sequence) -> None:
        for group, table in zip(self.groups, seq.block_tables):
            for block in reversed(table):
                group.pool.release(block)
        seq.block_tables = []

    def release_out_of_window(self, seq: Sequence) -> None:
        """Drop sliding-group blocks no future query of seq can see."""
        for group, table in zip(self.groups, seq.block_tables):
            for i in range(group.first_needed_block(seq.num_computed_tokens, self.block_size)):
                if table[i] != NULL_BLOCK:
                    group.pool.release(table[i])
                    table[i] = NULL_BLOCK

    def _ensure_tables(self, seq: Sequence) -> None:
        if not seq.block_tables:
            seq.block_tables = [[] for _ in self.groups]

    # -- prefix caching -----------------------------------------------------------------------------------
    def update_block_hashes(self, seq: Sequence) -> None:
        """Hash every newly completed block of seq and make it findable in each group."""
        full_blocks = seq.num_computed_tokens // self.block_size
        first_new = len(seq.block_hashes)
        while len(seq.block_hashes) < full_blocks:
            i = len(seq.block_hashes)
            previous = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(hash((previous, tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size]))))
        if not self.enable_prefix_caching:
            return
        for group, table in zip(self.groups, seq.block_tables):
            for i in range(first_new, min(full_blocks, len(table))):
                group.pool.register(table[i], seq.block_hashes[i])

    def _prompt_hashes(self, seq: Sequence) -> list[int]:
        hashes, previous = [], None
        usable = (len(seq.token_ids) - 1) // self.block_size  # the last token is always computed
        for i in range(usable):
            previous = hash((previous, tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])))
            hashes.append(previous)
        return hashes

    def _group_can_serve(self, group: KVGroup, hashes: list[int], num_blocks: int) -> bool:
        first = group.first_needed_block(num_blocks * self.block_size, self.block_size)
        return all(hashes[i] in group.pool.block_of for i in range(first, num_blocks))

    def apply_prefix_hit(self, seq: Sequence) -> int:
        """Reuse the longest cached prefix that every group can serve exactly; returns tokens reused."""
        self._ensure_tables(seq)
        if not self.enable_prefix_caching or seq.num_computed_tokens:
            return 0
        hashes = self._prompt_hashes(seq)
        hit = len(hashes)
        while hit and not all(self._group_can_serve(g, hashes, hit) for g in self.groups):
            hit -= 1
        for group, table in zip(self.groups, seq.block_tables):
            first = group.first_needed_block(hit * self.block_size, self.block_size)
            table.extend([NULL_BLOCK] * first)
            table.extend(group.pool.take_cached(hashes[i]) for i in range(first, hit))
        seq.block_hashes = hashes[:hit]
        seq.num_computed_tokens = seq.num_cached_tokens = hit * self.block_size
        return seq.num_computed_tokens

    # -- views ----------------------------------------------------------------------------------------------
    def slot(self, seq: Sequence, group_id: int, position: int) -> int:
        block = seq.block_tables[group_id][position // self.block_size]
        return block * self.block_size + position % self.block_size

    def usage(self) -> list[tuple[KVSpec, int, int]]:
        """(spec, used blocks, usable blocks) per group."""
        return [(g.spec, g.pool.num_used, g.pool.num_blocks - 1) for g in self.groups]
