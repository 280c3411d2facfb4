"""Launch constants of the FP8 GEMMs (gemm.py, moe.py): the one place to read and retune them."""
from dataclasses import dataclass, replace

import torch

from atomlite.model_ops.triton.common import platform_of


@dataclass(frozen=True)
class FP8TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: bool = False  # split K over programs until the GPU is full (decode: bound by streaming W)
    programs_per_sm: int = 2
    min_k_steps: int = 4


DECODE_ROWS = 16  # up to this many rows: the split-K path
LIBRARY_MIN_ROWS = 64  # beyond, torch._scaled_mm where it takes the scales (gemm.library_fits); not yet timed
# Decode tiles from bench/fp8_decode_sweep.py (H200, 31B's shapes, 1 and 16 rows): 256 fp8 bytes of K a step, the
# bytes bf16 reads at BLOCK_K 128; scales per 128-wide K block take one block a step.
DECODE = FP8TileConfig(16, 64, 256, 4, 3, split_k=True)
DECODE_K_BLOCKS = FP8TileConfig(16, 128, 128, 4, 3, split_k=True)
MEDIUM = FP8TileConfig(64, 128, 128, 4, 4, split_k=True)  # up to 64 rows: split K where the tiles are few
LARGE = FP8TileConfig(128, 128, 128, 8, 3)
EXACT = FP8TileConfig(16, 32, 128, 4, 1, split_k=True)  # fp32 dots (the interpreter, fp32 models): small tiles
# the narrowest K block (or group) a scale may span: every tile that runs with K-block scales steps through one
SCALE_K_STEP = max(config.block_k for config in (DECODE_K_BLOCKS, MEDIUM, LARGE, EXACT))
AMD_STAGES = 2  # LDS: 64 KiB on gfx942


def tile_config(m: int, device: torch.device, fp32_dot: bool, k_blocks: bool = False) -> FP8TileConfig:
    """k_blocks: x or W has a scale per 128-wide block of K."""
    if fp32_dot:
        return EXACT
    decode = DECODE_K_BLOCKS if k_blocks else DECODE
    config = decode if m <= DECODE_ROWS else MEDIUM if m <= 64 else LARGE
    if platform_of(device).kind == "rocm":
        config = replace(config, num_stages=AMD_STAGES)
    return config


# Up to this many (token, slot) pairs the experts take one pair per block, unsorted (moe.PairLayout). Set from the
# MoE bf16 path's measured crossover (moe/tuning.GEMV_MAX_PAIRS), not yet timed for fp8.
PAIR_BLOCKS_MAX_PAIRS = 32


def moe_block_m(pairs: int) -> int:
    """Rows per expert block of the grouped GEMM: decode's few pairs per expert waste less in small blocks."""
    return 16 if pairs <= 256 else 64


def moe_tile_config(block_m: int, device: torch.device, fp32_dot: bool) -> FP8TileConfig:
    if fp32_dot:
        return FP8TileConfig(block_m, EXACT.block_n, EXACT.block_k, EXACT.num_warps, EXACT.num_stages)
    stages = AMD_STAGES if platform_of(device).kind == "rocm" else 4 if block_m <= 16 else 3
    return FP8TileConfig(block_m, 64 if block_m <= 16 else 128, 128, 4, stages)
