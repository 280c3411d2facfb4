"""Where each KV group's blocks lie in the one KV memory that every group shares.

The memory is cut into pages of one byte size. A page holds one block of the group whose blocks are largest (a
block: block_size tokens of every layer the group owns, K and V, or V alone), or several blocks of a group with
smaller ones (blocks_per_page). A group's block b lies in page b // blocks_per_page, at a fixed stride, so one
strided view per layer addresses it: [blocks, block_size, kv_heads, head_dim], the block stride being the page size
divided by blocks_per_page. Any free page can serve any group, which is what lets short requests use the memory a
split by max-length sequences would have left to the global layers.
"""
import math
from dataclasses import dataclass

import torch

from atomlite.model_ops.kv_spec import KVSpec

ALIGNMENT = 16  # bytes: every block starts at a multiple of it (16-byte vector loads)


@dataclass(frozen=True)
class GroupLayout:
    spec: KVSpec
    layers: list[int]  # the layers that own a cache in this group
    block_size: int
    blocks_per_page: int
    block_stride: int  # bytes from one of the group's blocks to the next

    @property
    def tensor_bytes(self) -> int:
        """One layer's K (or V) for one block."""
        return self.block_size * self.spec.num_kv_heads * self.spec.head_dim * self.spec.dtype.itemsize

    @property
    def bytes_per_token(self) -> int:
        """One token of every layer of the group."""
        return len(self.layers) * self.spec.bytes_per_token

    @property
    def block_bytes(self) -> int:
        """One block of every layer of the group (what a page slot must hold)."""
        return len(self.layers) * self.spec.tensors_per_token * self.tensor_bytes

    def view(self, memory: torch.Tensor, layer_index: int, tensor: int) -> torch.Tensor:
        """Layer layers[layer_index]'s K (tensor 0) or V (tensor 1; 0 where the layer stores V alone) over memory,
        a uint8 tensor of whole pages: [blocks, block_size, kv_heads, head_dim]."""
        spec, item = self.spec, self.spec.dtype.itemsize
        typed = memory.view(spec.dtype)
        num_blocks = memory.numel() // self.block_stride
        offset = (layer_index * spec.tensors_per_token + tensor) * self.tensor_bytes
        shape = (num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
        strides = (self.block_stride // item, spec.num_kv_heads * spec.head_dim, spec.head_dim, 1)
        return typed.as_strided(shape, strides, offset // item)


@dataclass(frozen=True)
class PageLayout:
    page_bytes: int
    groups: list[GroupLayout]

    def pages_for(self, blocks: list[int]) -> int:
        """The fewest pages that hold blocks[g] blocks of each group g (sequences share partly used pages)."""
        return sum(math.ceil(n / g.blocks_per_page) for n, g in zip(blocks, self.groups))

    def seqs_that_fit(self, usable_pages: int, seq_len: int) -> int:
        """How many sequences of seq_len tokens usable_pages pages hold at once."""
        held = [g.spec.blocks_held(seq_len, g.block_size) for g in self.groups]
        per_seq = sum(n / g.blocks_per_page for n, g in zip(held, self.groups))
        count = int(usable_pages / per_seq) + 1
        while count and self.pages_for([count * n for n in held]) > usable_pages:
            count -= 1
        return count


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def page_layout(grouped: list[tuple[KVSpec, list[int]]], block_size: int) -> PageLayout:
    """The page size and each group's place in a page. Pages are sized by the largest group's block; a group fits as
    many of its blocks as whole ones go in, each slot widened so that the slots tile the page exactly (the page is
    rounded up so that every group's slot is a multiple of ALIGNMENT)."""
    def block_bytes(spec: KVSpec, layers: list[int]) -> int:
        return _round_up(len(layers) * block_size * spec.bytes_per_token, ALIGNMENT)

    largest = max(block_bytes(s, layers) for s, layers in grouped)
    per_page = [largest // block_bytes(s, layers) for s, layers in grouped]
    page = _round_up(largest, math.lcm(*per_page) * ALIGNMENT)
    groups = [GroupLayout(spec, layers, block_size, k, page // k) for (spec, layers), k in zip(grouped, per_page)]
    return PageLayout(page, groups)
