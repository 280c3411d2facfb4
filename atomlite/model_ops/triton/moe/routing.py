"""Routing for the fused MoE GEMMs: (token, slot) pairs grouped by expert into tiles of BLOCK_M rows, on the GPU.

Pair p = token * top_k + slot. Each expert's pairs fill whole tiles (its last tile partly), in pair order, so the
grouped GEMM reads one expert's weights per tile. Every output has a size fixed by the number of pairs (an upper
bound on the tiles any routing can need), and nothing is read back to the host: a CUDA/HIP graph can replay it.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import run_kernel
from atomlite.model_ops.triton.moe.tuning import (COUNT_ELEMENTS, ONE_PROGRAM_MAX_PAIRS, PAIR_CHUNK, ROUTING_WARPS,
                                                  TILE_CHUNK)

MAX_EXPERTS = 512  # the routing holds a one-hot [64, experts] per step


@dataclass(frozen=True)
class ExpertTiles:
    """pair_of_row [max_tiles * block_m]: the pair each row of a tile computes (rows past tile_rows unset);
    tile_expert [max_tiles]: the expert of each tile, -1 for tiles the routing does not use;
    tile_rows [max_tiles]: how many leading rows of each tile hold a pair."""
    pair_of_row: torch.Tensor
    tile_expert: torch.Tensor
    tile_rows: torch.Tensor
    block_m: int

    @property
    def max_tiles(self) -> int:
        return self.tile_expert.shape[0]


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Tiles any routing of num_pairs pairs can need: at most min(E, pairs) experts get a partial last tile."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


@triton.jit
def _one_hot_chunk(topk_ids, chunk, NUM_PAIRS, CHUNK: tl.constexpr, EXPERTS: tl.constexpr):
    """(pair indices [CHUNK], one-hot [CHUNK, EXPERTS] int32 of their experts; all-zero rows past NUM_PAIRS)."""
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(topk_ids + pairs, mask=pairs < NUM_PAIRS, other=-1)
    return pairs, (ids[:, None] == tl.arange(0, EXPERTS)[None, :]).to(tl.int32)


@triton.jit
def _count_kernel(topk_ids, chunk_counts, NUM_PAIRS, CHUNK: tl.constexpr, EXPERTS: tl.constexpr):
    chunk = tl.program_id(0)
    _, one_hot = _one_hot_chunk(topk_ids, chunk, NUM_PAIRS, CHUNK, EXPERTS)
    tl.store(chunk_counts + chunk * EXPERTS + tl.arange(0, EXPERTS), tl.sum(one_hot, axis=0))


@triton.jit
def _write_tile_table(tile_expert, tile_rows, totals, tiles, tile_end, MAX_TILES, first, step,
                      BLOCK_M: tl.constexpr, EXPERTS: tl.constexpr, TILE_CHUNK: tl.constexpr):
    """Tiles first, first + step, ... (in TILE_CHUNK runs): their expert (-1 past the used ones) and used rows."""
    used_tiles = tl.sum(tiles, axis=0)
    for t0 in range(first, MAX_TILES, step):
        t = t0 + tl.arange(0, TILE_CHUNK)
        # experts whose tiles all end at or before t: the index of t's expert (empty experts end where they start)
        expert = tl.sum((tile_end[None, :] <= t[:, None]).to(tl.int32), axis=1)
        is_expert = expert[:, None] == tl.arange(0, EXPERTS)[None, :]
        first_tile = tl.sum(tl.where(is_expert, tile_end - tiles, 0), axis=1)
        pairs = tl.sum(tl.where(is_expert, totals, 0), axis=1)
        rows = tl.minimum(pairs - (t - first_tile) * BLOCK_M, BLOCK_M)
        used = t < used_tiles
        tl.store(tile_expert + t, tl.where(used, expert, -1), mask=t < MAX_TILES)
        tl.store(tile_rows + t, tl.where(used, rows, 0), mask=t < MAX_TILES)


# Counts that change from step to step are not specialized on (1, multiples of 16): each new combination would be a
# compile in the middle of serving, seconds of a stalled step on a fresh machine (bench/compile_misses.py).
@triton.jit(do_not_specialize=["NUM_PAIRS", "NUM_CHUNKS", "MAX_TILES"])
def _place_kernel(topk_ids, chunk_counts, pair_of_row, tile_expert, tile_rows, NUM_PAIRS, NUM_CHUNKS, MAX_TILES,
                  ONE_PROGRAM: tl.constexpr, BLOCK_M: tl.constexpr, EXPERTS: tl.constexpr, CHUNK: tl.constexpr,
                  TILE_CHUNK: tl.constexpr, COUNT_ROWS: tl.constexpr):
    """ONE_PROGRAM: this program counts and places every chunk. Else program c places chunk c, after the pairs of
    earlier chunks (chunk_counts from _count_kernel, read COUNT_ROWS chunks at a time), and writes its share of the
    tile table."""
    pid = tl.program_id(0)
    experts = tl.arange(0, EXPERTS)
    totals = tl.zeros((EXPERTS,), dtype=tl.int32)
    before = tl.zeros((EXPERTS,), dtype=tl.int32)  # this expert's pairs in chunks before the current one
    if ONE_PROGRAM:
        for c in range(0, NUM_CHUNKS):
            _, one_hot = _one_hot_chunk(topk_ids, c, NUM_PAIRS, CHUNK, EXPERTS)
            totals += tl.sum(one_hot, axis=0)
        first_chunk, end_chunk = 0, NUM_CHUNKS
    else:
        for c0 in range(0, NUM_CHUNKS, COUNT_ROWS):
            chunks = c0 + tl.arange(0, COUNT_ROWS)
            counts = tl.load(chunk_counts + chunks[:, None] * EXPERTS + experts[None, :],
                             mask=(chunks < NUM_CHUNKS)[:, None], other=0)
            totals += tl.sum(counts, axis=0)
            before += tl.sum(tl.where((chunks < pid)[:, None], counts, 0), axis=0)
        first_chunk, end_chunk = pid, pid + 1
    tiles = (totals + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, axis=0)
    first_row = (tile_end - tiles) * BLOCK_M
    for c in range(first_chunk, end_chunk):
        pairs, one_hot = _one_hot_chunk(topk_ids, c, NUM_PAIRS, CHUNK, EXPERTS)
        rank = tl.cumsum(one_hot, axis=0) - one_hot  # earlier pairs of the same expert in this chunk
        row = tl.sum(one_hot * (rank + (first_row + before)[None, :]), axis=1)
        tl.store(pair_of_row + row, pairs, mask=pairs < NUM_PAIRS)
        before += tl.sum(one_hot, axis=0)
    programs = tl.num_programs(0)
    _write_tile_table(tile_expert, tile_rows, totals, tiles, tile_end, MAX_TILES, pid * TILE_CHUNK,
                      programs * TILE_CHUNK, BLOCK_M, EXPERTS, TILE_CHUNK)


def group_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertTiles:
    """topk_ids [T, top_k] -> the tiles of the grouped GEMMs; one launch up to ONE_PROGRAM_MAX_PAIRS pairs, two
    beyond. Sizes depend on T, top_k, num_experts and block_m only."""
    ids = topk_ids.reshape(-1)
    if ids.stride(0) != 1:
        ids = ids.contiguous()
    num_pairs, device = ids.shape[0], ids.device
    tiles = max_tiles(num_pairs, num_experts, block_m)
    int32 = dict(dtype=torch.int32, device=device)
    out = ExpertTiles(torch.empty(tiles * block_m, **int32), torch.empty(tiles, **int32),
                      torch.empty(tiles, **int32), block_m)
    if num_pairs == 0:
        return out
    experts = triton.next_power_of_2(num_experts)
    chunks = triton.cdiv(num_pairs, PAIR_CHUNK)
    one_program = num_pairs <= ONE_PROGRAM_MAX_PAIRS
    chunk_counts = torch.empty((1 if one_program else chunks, experts), **int32)  # unread by one program
    if not one_program:
        run_kernel(_count_kernel, (chunks,), ids, chunk_counts, num_pairs, CHUNK=PAIR_CHUNK, EXPERTS=experts,
                   num_warps=ROUTING_WARPS)
    run_kernel(_place_kernel, (1 if one_program else chunks,), ids, chunk_counts, out.pair_of_row,
               out.tile_expert, out.tile_rows, num_pairs, chunks, tiles, ONE_PROGRAM=one_program, BLOCK_M=block_m,
               EXPERTS=experts, CHUNK=PAIR_CHUNK, TILE_CHUNK=TILE_CHUNK,
               COUNT_ROWS=max(1, COUNT_ELEMENTS // experts), num_warps=ROUTING_WARPS)
    return out
