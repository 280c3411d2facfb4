"""Launch constants of the FP8 GEMMs (gemm.py, moe.py): the one place to read and retune them."""
from dataclasses import dataclass, replace

import torch

from atomlite.model_ops.triton.common import interpreting, num_sms, platform_of


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
    tma: bool = False  # W's tiles by TMA where there is one (mxfp4.fp8_tiles.weight_loads)
    tail_m: int = 0  # x rows beyond block_m a program takes in a second, narrower product (gemm.scaled_tile)


DECODE_ROWS = 16  # up to this many rows: the split-K path
# Beyond these rows, torch._scaled_mm where it takes the scales (gemm.library_fits, library_block_fits). On NVIDIA its
# row-scaled GEMM ran 0.84-1.11x of bf16 at 160 rows on 31B's shapes, where the Triton tiles below ran 1.23-1.41x; at
# 128, 256 and 512 rows the library was 3-18% faster than the tiles on most shapes (bench/fp8_rows_sweep.py, H200),
# but a decode batch is rarely such a count. Elsewhere not timed. Block-scaled rows take cuBLAS's 1x128 block scaling
# beyond LIBRARY_MIN_ROWS everywhere: at 96-512 rows it ran 0.62-1.55x of bf16, these tiles with 128-wide K blocks
# 0.46-0.92x (bench/fp8_rows_sweep.py --block, H200).
LIBRARY_MIN_ROWS, NVIDIA_LIBRARY_MIN_ROWS = 64, 512
# Decode tiles from bench/fp8_decode_sweep.py (H200, 31B's shapes, 1 and 16 rows): 256 fp8 bytes of K a step, the
# bytes bf16 reads at BLOCK_K 128 (W's tiles by TMA within 1 us of these, quantization included).
DECODE = FP8TileConfig(16, 64, 256, 4, 3, split_k=True)
# Scales per 128-wide K block take one block a step: 64-row tiles, 4 programs per SM, unless W has more such tiles
# than that fills; then 128-row tiles by TMA (4 stages). 1 row, quantization included: qkv 28.1, o 17.0, gate_up 63.2,
# down 35.0 us, against 30.9 / 18.2 / 67.0 / 38.7 for 128-row tiles by pointers, 3 stages (16 rows: 29.9 / 18.6 /
# 65.1 / 37.6 against 33.2 / 20.1 / 68.3 / 42.4); 64-row tiles took 77.8 us on gate_up.
DECODE_K_BLOCKS = FP8TileConfig(16, 64, 128, 4, 4, split_k=True, programs_per_sm=4)
DECODE_K_BLOCKS_WIDE = FP8TileConfig(16, 128, 128, 4, 4, split_k=True, tma=True)
MEDIUM = FP8TileConfig(64, 128, 128, 4, 4, split_k=True)  # up to 64 rows: split K where the tiles are few
LARGE = FP8TileConfig(128, 128, 128, 8, 3)
# NVIDIA, 65 to NVIDIA_LIBRARY_MIN_ROWS rows: the fewest x-row tiles of these (W then streams once per tile), up to
# one where W's tiles alone fill most of the GPU, else up to three (bench/fp8_rows_sweep.py, H200). 128 + 32 rows
# (gemm.scaled_tile's tail) at 152 and 160 rows: qkv 33.3-34.6, gate_up 95.7-99.1 us, against 35.3-35.8 and
# 102.5-104.3 for 256 rows.
NVIDIA_ROW_TILES = (FP8TileConfig(64, 128, 256, 4, 3), FP8TileConfig(128, 128, 128, 8, 4),
                    FP8TileConfig(128, 128, 128, 8, 4, tail_m=32), FP8TileConfig(256, 128, 128, 8, 3))
# Where W's tiles fill less of the GPU, up to 160 rows: one x-row tile, narrow W tiles, K split to fill the GPU. At
# 72-128 rows o took 21.9-24.5 us and down 42.8-47.4 (24.1-25.7 and 54.4-55.7 with the tiles above); at 152 and 160
# rows (128 + 32) down 47.6-48.6 (58.4-58.6), o 26.9-27.1 (26.2-26.3).
NVIDIA_SPLIT_ROW_TILES = (FP8TileConfig(128, 64, 128, 4, 3, split_k=True),
                          FP8TileConfig(128, 64, 128, 4, 3, split_k=True, tail_m=32))
FILLING_TILES_PER_SM, MAX_ROW_TILES = 0.75, 3
EXACT = FP8TileConfig(16, 32, 128, 4, 1, split_k=True)  # fp32 dots (the interpreter, fp32 models): small tiles
# Under TRITON_INTERPRET=1 a program costs Python time per operation: EXACT's K steps over more rows and columns a
# program. Not bit for bit EXACT's: the interpreter's fp32 dot (numpy's matmul) rounds the last bits by the tile's
# shape, and with fewer tiles a long K may split in more parts (num_splits).
INTERPRETER = FP8TileConfig(64, 128, EXACT.block_k, 4, 1, split_k=True)
# the narrowest K block (or group) a scale may span: every tile that runs with K-block scales steps through one
SCALE_K_STEP = max(config.block_k for config in (DECODE_K_BLOCKS, DECODE_K_BLOCKS_WIDE, MEDIUM, LARGE, EXACT))
AMD_STAGES = 2  # LDS: 64 KiB on gfx942


def library_min_rows(device: torch.device) -> int:
    return NVIDIA_LIBRARY_MIN_ROWS if platform_of(device).kind == "cuda" else LIBRARY_MIN_ROWS


def tile_config(m: int, device: torch.device, fp32_dot: bool, k_blocks: bool = False, n: int = 0,
                fp8_x: bool = True) -> FP8TileConfig:
    """k_blocks: x or W has a scale per 128-wide block of K; n: W's rows; fp8_x: x is quantized (W8A16's 16-bit x
    tiles would not fit the row tiles' shared memory)."""
    if fp32_dot:
        return fp32_tiles()
    platform = platform_of(device)
    if m <= DECODE_ROWS:
        config = decode_k_blocks(n, num_sms(device)) if k_blocks else DECODE
    elif m <= 64:
        config = MEDIUM
    elif platform.kind == "cuda" and fp8_x:
        config = row_tiles(m, n, num_sms(device), k_blocks)
    else:
        config = LARGE
    if platform.kind == "rocm":
        config = replace(config, num_stages=AMD_STAGES)
    return config


def decode_k_blocks(n: int, sms: int) -> FP8TileConfig:
    """The decode tiles of block-scaled W (or x in groups) with n rows."""
    narrow = DECODE_K_BLOCKS
    return DECODE_K_BLOCKS_WIDE if -(-n // narrow.block_n) > narrow.programs_per_sm * sms else narrow


def fp32_tiles() -> FP8TileConfig:
    """The tiles of fp32 dots: the interpreter's larger ones under TRITON_INTERPRET=1, else EXACT."""
    return INTERPRETER if interpreting() else EXACT


def row_tiles(m: int, n: int, sms: int, k_blocks: bool) -> FP8TileConfig:
    filling = -(-n // NVIDIA_ROW_TILES[0].block_n) >= FILLING_TILES_PER_SM * sms
    split = next((c for c in NVIDIA_SPLIT_ROW_TILES if m <= rows_per_tile(c)), None)
    if split is not None and not filling:
        config = split
    else:
        most = 1 if filling else MAX_ROW_TILES
        config = next((c for c in NVIDIA_ROW_TILES if -(-m // rows_per_tile(c)) <= most), NVIDIA_ROW_TILES[-1])
    return replace(config, block_k=128) if k_blocks else config


def rows_per_tile(config: FP8TileConfig) -> int:
    return config.block_m + config.tail_m


# Up to this many (token, slot) pairs the experts take one pair per block, unsorted (moe.PairLayout). Set from the
# MoE bf16 path's measured crossover (moe/tuning.GEMV_MAX_PAIRS), not yet timed for fp8.
PAIR_BLOCKS_MAX_PAIRS = 32


def moe_block_m(pairs: int) -> int:
    """Rows per expert block of the grouped GEMM: decode's few pairs per expert waste less in small blocks."""
    return 16 if pairs <= 256 else 64


def moe_tile_config(block_m: int, device: torch.device, fp32_dot: bool) -> FP8TileConfig:
    if fp32_dot:
        return replace(fp32_tiles(), block_m=block_m, split_k=False)
    stages = AMD_STAGES if platform_of(device).kind == "rocm" else 4 if block_m <= 16 else 3
    return FP8TileConfig(block_m, 64 if block_m <= 16 else 128, 128, 4, stages)
