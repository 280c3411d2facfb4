"""Per-layer heterogeneous paged KV cache over one shared memory.

Layers with equal KVSpecs form a group; each group has its own block table per sequence and its own blocks, carved
from pages that every group draws from (block_pool, kv_layout), and one K and one V view per owning layer,
[blocks, block_size, kv_heads, head_dim]. Sliding groups release blocks that fell out of the window; shared layers
own nothing and read their target's cache.

Prefix caching keys each full block by SHA-256 over its parent block's key and its token ids, so a key names the
whole prefix up to that block; a block that holds an image's soft tokens also covers the image's content hash and
where the block starts within it (seq_images.block_image_marks), so the same placeholders with another image never
hit; a sequence with a LoRA adapter chains its first block from a root of its adapter's (the hash of the adapter's
weights), so no block is shared between adapters or with the base model. A sequence's keys are computed once, as its blocks fill (Sequence.block_keys). A hit
is also checked against the block's own tokens and parent key as stored in the pool, so that a weaker block_key
(tests swap in a colliding one) can cost cache hits but never correctness.
"""
import contextlib
import hashlib
import math
from array import array
from collections.abc import Sequence as TokenIds
from dataclasses import dataclass

import torch

from atomlite.engine.kv.block_pool import NULL_BLOCK, BlockPool, PagePool
from atomlite.engine.kv.block_table import BlockTable
from atomlite.engine.kv.kv_layout import page_layout
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.engine.sequence import Sequence
from atomlite.engine.images.seq_images import block_image_marks, outside_images


def sha256_block_key(parent_key: bytes, token_ids: TokenIds[int]) -> bytes:
    """The key of a block holding token_ids after the prefix named by parent_key: ~100 ns per token."""
    return hashlib.sha256(parent_key + array("q", token_ids).tobytes()).digest()


def root_key(specs: list[KVSpec], cache_salt: str) -> bytes:
    """The parent key of a sequence's first block. It covers whatever changes a block's KV besides the tokens
    (each layer's KV dtype, plus cache_salt) so that no key can ever match a block written another way. A fixed
    root is safe: finding two prefixes with one key means a SHA-256 collision whatever the root, and a random one
    would only make keys differ between runs of the same model."""
    kinds = ",".join(f"{s.kind}:{s.dtype}" for s in specs)
    return hashlib.sha256(f"atomlite prefix cache v1|{kinds}|{cache_salt}".encode()).digest()


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
    def __init__(self, specs: list[KVSpec], num_pages: int, block_size: int, device: torch.device,
                 enable_prefix_caching: bool = True, cache_salt: str = ""):
        grouped, self.layer_group = group_specs(specs)
        self.specs = specs
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_key = sha256_block_key
        self.root_key = root_key(specs, cache_salt)
        self.layout = page_layout(grouped, block_size)
        self.pages = PagePool(num_pages)
        self.groups = [KVGroup(i, g.spec, g.layers, BlockPool(self.pages, g.blocks_per_page))
                       for i, g in enumerate(self.layout.groups)]
        self.memory = torch.zeros(num_pages * self.layout.page_bytes, dtype=torch.uint8, device=device)
        self.caches: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        for layout in self.layout.groups:
            for i, layer in enumerate(layout.layers):
                if layout.spec.k_from_v:
                    self.caches[layer] = (None, layout.view(self.memory, i, 0))
                else:
                    self.caches[layer] = (layout.view(self.memory, i, 0), layout.view(self.memory, i, 1))

    def cache_for_layer(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor, int]:
        """(K cache, None when the layer derives K from V; V cache; group)."""
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

    def _needed(self, seq: Sequence, num_new_tokens: int) -> list[int]:
        self._ensure_tables(seq)
        return [self._new_blocks_needed(seq, g, num_new_tokens) for g in self.groups]

    def pages_needed(self, blocks: list[int]) -> int:
        """The free pages that blocks[g] more blocks of each group g would take."""
        return sum(g.pool.pages_needed(n) for g, n in zip(self.groups, blocks))

    def fits(self, blocks: list[int]) -> bool:
        """Whether blocks[g] more blocks of each group g can be had now."""
        return self.pages_needed(blocks) <= self.pages.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give seq the blocks for its next num_new_tokens in every group; all or nothing."""
        if seq.num_computed_tokens + num_new_tokens <= seq.kv_covered_tokens:
            return True  # most decode steps stay inside blocks held already
        needed = self._needed(seq, num_new_tokens)
        if not self.fits(needed):
            return False
        for group, count in zip(self.groups, needed):
            table = seq.block_tables[group.id]
            first = group.first_needed_block(seq.num_computed_tokens, self.block_size)
            table.extend([NULL_BLOCK] * max(0, first - len(table)))
            table.extend([group.pool.allocate() for _ in range(count)])
        self._note_coverage(seq)
        return True

    def _note_coverage(self, seq: Sequence) -> None:
        seq.kv_covered_tokens = min(len(table) for table in seq.block_tables) * self.block_size

    def blocks_held(self, num_tokens: int) -> list[int]:
        """Per group, the most blocks a sequence of num_tokens tokens holds."""
        return [g.spec.blocks_held(num_tokens, self.block_size) for g in self.groups]

    def blocks_allocated(self, seq: Sequence) -> list[int]:
        """Per group, the blocks seq holds now (its table less the out-of-window entries released)."""
        if not seq.block_tables:
            return [0] * len(self.groups)
        return [len(table) - released for table, released in zip(seq.block_tables, seq.released_until)]

    def free(self, seq: Sequence) -> None:
        for group, table in zip(self.groups, seq.block_tables):
            for block in reversed(table):
                group.pool.release(block)
        seq.block_tables, seq.released_until = [], []
        seq.kv_covered_tokens = 0

    def release_out_of_window(self, seq: Sequence) -> None:
        """Drop sliding-group blocks no future query of seq can see; looks only at blocks not yet released."""
        for group, table in zip(self.groups, seq.block_tables):
            start = seq.released_until[group.id]
            end = group.first_needed_block(seq.num_computed_tokens, self.block_size)
            for i in range(start, end):
                group.pool.release(table[i])
                table[i] = NULL_BLOCK
            seq.released_until[group.id] = max(start, end)

    def _ensure_tables(self, seq: Sequence) -> None:
        if not seq.block_tables:
            seq.block_tables = [BlockTable() for _ in self.groups]
            seq.released_until = [0] * len(self.groups)

    # -- prefix caching -----------------------------------------------------------------------------------
    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])

    def _parent_key(self, seq: Sequence, keys: list[bytes], i: int) -> bytes:
        if i:
            return keys[i - 1]
        # a LoRA adapter changes every layer's K/V: its sequences' blocks chain from a root of their own
        return hashlib.sha256(self.root_key + seq.lora_key).digest() if seq.lora_key else self.root_key

    def _chained(self, seq: Sequence, keys: list[bytes], i: int) -> bytes:
        """The parent's key, and after it, for a block under an image, what names the image there."""
        parent = self._parent_key(seq, keys, i)
        if seq.images:
            return parent + block_image_marks(seq.images, i * self.block_size, self.block_size)
        return parent

    def _identity(self, seq: Sequence, keys: list[bytes], i: int) -> tuple[bytes, tuple[int, ...]]:
        """What block i must have been computed from: checked on a hit, so a key collision cannot serve it."""
        return self._chained(seq, keys, i), self._block_tokens(seq, i)

    def _extend_keys(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """seq's block keys, extended to its first num_blocks full blocks, each chained to the one before. They
        depend on the tokens alone, so they are computed once and kept through preemption."""
        keys = seq.block_keys
        while len(keys) < num_blocks:
            i = len(keys)
            keys.append(self.block_key(self._chained(seq, keys, i), self._block_tokens(seq, i)))
        return keys

    @contextlib.contextmanager
    def prefix_caching_off(self):
        """No prefix hit and no block registered inside (a bench re-running a prompt to observe its prefill)."""
        enabled, self.enable_prefix_caching = self.enable_prefix_caching, False
        try:
            yield
        finally:
            self.enable_prefix_caching = enabled

    def update_block_hashes(self, seq: Sequence) -> None:
        """Key every newly computed full block of seq and make it findable in each group."""
        full_blocks = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        first_new = seq.num_registered_blocks
        if full_blocks <= first_new:
            return
        seq.num_registered_blocks = full_blocks
        if not self.enable_prefix_caching:
            return
        keys = self._extend_keys(seq, full_blocks)
        for i in range(first_new, full_blocks):
            identity = self._identity(seq, keys, i)
            for group, table in zip(self.groups, seq.block_tables):
                if i < len(table):
                    group.pool.register(table[i], keys[i], identity)

    def _holds(self, group: KVGroup, seq: Sequence, keys: list[bytes], i: int) -> bool:
        """Whether group has seq's block i cached, computed from exactly what seq's is."""
        return group.pool.find(keys[i], self._identity(seq, keys, i)) is not None

    def _first_missing(self, group: KVGroup, seq: Sequence, keys: list[bytes], num_blocks: int) -> int | None:
        """The first block a hit of num_blocks needs from group that it does not hold (None: it can serve)."""
        first = group.first_needed_block(num_blocks * self.block_size, self.block_size)
        return next((i for i in range(first, num_blocks) if not self._holds(group, seq, keys, i)), None)

    def _leading_cached(self, seq: Sequence, num_blocks: int) -> int:
        """How many of seq's first num_blocks blocks in a row the groups that need every block of a hit that long
        hold: no hit goes further. Keys are computed as far as the first miss only (a new prompt: one key)."""
        needs_all = [g for g in self.groups if g.first_needed_block(num_blocks * self.block_size, self.block_size) == 0]
        i = 0
        while needs_all and i < num_blocks:
            keys = self._extend_keys(seq, i + 1)
            if not all(self._holds(g, seq, keys, i) for g in needs_all):
                break
            i += 1
        return i if needs_all else num_blocks

    def apply_prefix_hit(self, seq: Sequence) -> int:
        """Reuse the longest cached prefix that every group can serve exactly; returns tokens reused."""
        self._ensure_tables(seq)
        if not self.enable_prefix_caching or seq.num_computed_tokens:
            return 0
        last_full = (len(seq.token_ids) - 1) // self.block_size  # the last token is always computed
        hit = self._hit_outside_images(seq, self._leading_cached(seq, last_full))
        keys = self._extend_keys(seq, hit)
        while hit:
            # a group missing block i needs it for every hit past i (its first needed block only grows with the hit)
            missing = [i for i in (self._first_missing(g, seq, keys, hit) for g in self.groups) if i is not None]
            if not missing:
                break
            hit = self._hit_outside_images(seq, min(missing))
        for group, table in zip(self.groups, seq.block_tables):
            first = group.first_needed_block(hit * self.block_size, self.block_size)
            table.extend([NULL_BLOCK] * first)
            table.extend([group.pool.take_cached(keys[i], self._identity(seq, keys, i)) for i in range(first, hit)])
        seq.num_registered_blocks = hit
        self._note_coverage(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = hit * self.block_size
        return seq.num_computed_tokens

    def _hit_outside_images(self, seq: Sequence, num_blocks: int) -> int:
        """num_blocks, or the most fewer that end outside every image: an image's start rounded down to a block
        may fall inside the image before it, so this repeats until the end moves no more."""
        while seq.images:
            outside = outside_images(seq.images, num_blocks * self.block_size) // self.block_size
            if outside == num_blocks:
                break
            num_blocks = outside
        return num_blocks

    # -- views ----------------------------------------------------------------------------------------------
    def usage(self) -> list[tuple[KVSpec, int, int]]:
        """(spec, used blocks, usable blocks) per group."""
        return [(g.spec, g.pool.num_used, g.pool.num_usable) for g in self.groups]
