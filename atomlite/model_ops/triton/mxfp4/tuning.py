"""Launch constants of the MXFP4 GEMM paths (gemm.py picks one: fp8_tiles, lookup, blockwise, bf16 slabs or the
bf16-expanding kernel): the one place to read and retune them. Sweeps are bench/fp4_gemm.py --sweep."""
from dataclasses import dataclass

# Which path runs, by rows of x (gemm.pick_path): the fp8 tiles up to FP8_MAX_M, the lookup kernel from LOOKUP_MIN_M
# (where the weight's scales fit it), cuBLAS's block-scaled fp8 GEMM from BLOCKWISE_MIN_M, the vendor GEMM on bf16
# slabs from DEQUANTIZE_MIN_M, else the bf16-expanding kernel.
FP8_MAX_M = 64  # per-block fp8 measured faster than the bf16 kernel at 64 rows, slower at 256 (H100 sweep)
LOOKUP_MIN_M = 5  # up to FP8_MAX_M rows; at 1-4 rows the fp8 tiles measured as fast or faster (H100)
# At 128 rows the bf16 kernel measured as fast on 21504 x 5376, 2.7x slower on 5376 x 21504, 1.8x on 8192 x 5376.
BLOCKWISE_MIN_M = 128
DEQUANTIZE_MIN_M = 512
# Where the weight has an e4m3 copy (row_copy.py), from this many rows. On 31B's four shapes (H200,
# bench/fp4_row_copy.py) it ran 1.03-1.49x of bf16 at 65-96 rows, where the bf16-expanding kernel ran 0.18-0.56x,
# and 0.80-1.77x at 128-2048, where the block-scaled slabs ran 0.46-1.23x; at 64 rows the lookup kernel was as fast
# or faster (the four shapes: 28.9, 26.3, 74.7, 49.2 against 41.9, 30.3, 76.2, 50.8 us).
ROW_COPY_MIN_M = FP8_MAX_M + 1
# rows per program of the activations' fold (one 256-K step each), H200: 8 x 4 warps 1-8% faster than 16 x 4 at
# 160 x 21504, 512 x 21504, 2048 x 5376 and 2048 x 21504 rows x K, 5.7 against 5.4 us at 160 x 5376; 4 x 4, 32 x 8
# and 64 x 8 slower; 16 x 8 2% faster at 2048 x 21504 only
ROW_COPY_FOLD_ROWS, ROW_COPY_FOLD_WARPS = 8, 4


# --- the bf16-expanding kernel (gemm.py) ---

@dataclass(frozen=True, slots=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_n: int = 8
    prefetch: bool = False  # load the next weight tile into registers during this one
    split_k: int = 1  # K splits, summed with fp32 atomics; pick_config sets it when N has too few tiles


# Best of the sweep on an H200 for Gemma-4-31B shapes: DECODE up to DECODE_MAX_M rows, PREFILL up to PREFILL_MAX_M.
DECODE = GemmConfig(block_m=16, block_n=64, block_k=256, num_warps=4, num_stages=4, prefetch=True)
PREFILL = GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)
LARGE_PREFILL = GemmConfig(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3)
DECODE_MAX_M, PREFILL_MAX_M = 32, 256
# Decode with fewer N tiles than MIN_DECODE_TILES splits K (up to DECODE_MAX_SPLIT_K ways) towards two programs per SM
# of an H100/H200 (132 SMs), so that every SM streams weights.
MIN_DECODE_TILES, DECODE_PROGRAMS, DECODE_MAX_SPLIT_K = 100, 264, 4

# --- large M: weight slabs expanded for the vendor GEMM (gemm.py) or cuBLAS's fp8 GEMM (blockwise.py) ---

# bf16 slabs of about 2048 x 21504 values (84 MiB): the best slab measured 2048 rows at K=21504 and 8192 rows at
# K=5376 (H100, M=2048).
SLAB_VALUES = 2048 * 21504
DEQUANTIZE_BLOCK_N, DEQUANTIZE_WARPS = 64, 4  # the expansion kernel's weight rows and warps per program
# e4m3 slabs (H100, M = 128 to 2048): for long K, slabs of about 4096 x 21504 values (84 MiB), whose GEMMs hide the
# next slab's expansion; for K up to LONG_K, one slab of up to 256 MiB, since two slabs' GEMMs measured slower than
# one (21504 x 5376 at M = 2048: 546 us in 4096-row slabs, 519 in one).
LONG_K, LONG_K_SLAB_VALUES, SHORT_K_SLAB_VALUES = 8192, 4096 * 21504, 2 ** 28
# 32 rows and 8 warps per program quantized at copy speed, 16 rows x 4 warps 11% slower (H100).
BLOCKWISE_QUANTIZE_ROWS, BLOCKWISE_QUANTIZE_WARPS = 32, 8
BLOCKWISE_EXPAND_ROWS, BLOCKWISE_EXPAND_WARPS = 64, 4

# --- the fp8 tiles (fp8_tiles.py) ---

@dataclass(frozen=True, slots=True)
class Fp8Config:
    block_m: int  # rows of x per tile
    block_n: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    period: int = 1  # P of fp8_tiles' docstring: 1, 2, 4 or 8
    # Weight tiles by TMA where there is one (weight_loads): for the tiles of 4-64 rows 1 us slower to 2 us faster
    # than pointer loads, by shape and rows (H100), so off there.
    tma: bool = False
    # K split into parts of at most this many 256-K steps, and into enough for WIDE_MIN_PROGRAMS programs (pick_config)
    split_steps: int = 0

    def __post_init__(self):
        if self.period not in (1, 2, 4, 8) or self.period * self.block_m < 16 or self.period * self.block_m > 128:
            raise ValueError(f"fp8 GEMM tiles take period 1, 2, 4 or 8 with block_m * period from 16 to 128; "
                             f"got period {self.period}, block_m {self.block_m}")


# 1-2 rows (decode at batch 1-2), H200, bench/fp4_gemm.py --sweep --unsummed --ms 1 on 31B's six weights: 128-row
# weight tiles by TMA with K split by split_steps took 37.8 / 21.1 / 17.1 / 20.5 / 12.1 / 17.7 us for gate_up,
# down, sliding and global qkv, sliding and global o, where 64-row tiles split by tile count took 42.2 / 22.8 / 19.5
# / 21.8 / 11.9 / 18.6 (unsummed: the layers' consumers add split-K parts as they read them). 31B MXFP4 TPOT at
# batch 1 (bench latency, one machine): 7.21 against 7.96 ms. Only where each part keeps WIDE_MIN_PART_STEPS steps
# (31B's: 5-14); shorter K (26B-A4B's 2816-4096) was not timed with these tiles and keeps BLOCK_DIAGONAL_2.
WIDE_DIAGONAL_2 = Fp8Config(block_m=2, block_n=128, num_warps=4, num_stages=3, period=8, tma=True, split_steps=14)
WIDE_MIN_PROGRAMS, WIDE_MIN_PART_STEPS = 252, 4  # about 2 programs per SM of an H200
# Best of the sweep on an H100 for Gemma-4-31B shapes.
BLOCK_DIAGONAL_2 = Fp8Config(block_m=2, block_n=64, num_warps=4, num_stages=3, period=8)
BLOCK_DIAGONAL_4 = Fp8Config(block_m=4, block_n=64, num_warps=4, num_stages=3, period=8)
QUAD_DIAGONAL_8 = Fp8Config(block_m=8, block_n=64, num_warps=4, num_stages=3, period=4)
PAIR_DIAGONAL_16 = Fp8Config(block_m=16, block_n=64, num_warps=4, num_stages=3, period=2)  # 2 tiles at 32 rows
PER_BLOCK_32 = Fp8Config(block_m=32, block_n=64, num_warps=4, num_stages=3)  # 32 rows: splitting K measured slower
TILES = [(2, BLOCK_DIAGONAL_2), (4, BLOCK_DIAGONAL_4), (8, QUAD_DIAGONAL_8), (32, PAIR_DIAGONAL_16),
         (FP8_MAX_M, PER_BLOCK_32)]  # (up to this many rows, tile config)
FP8_QUANTIZE_ROWS, FP8_QUANTIZE_WARPS = 16, 4  # rows per program of the period-1 quantization (period > 1: one)
SUM_BLOCK, SUM_WARPS = 1024, 4  # output elements and warps per program of the split-K sum

# --- shared by the fp8 tiles and the lookup kernel ---

# With fewer output tiles than SPLIT_K_BELOW_TILES, K is split so that every SM streams weights:
# SPLIT_K_FEWEST_TILES ways under SPLIT_K_BELOW_TILES / 2 tiles, else SPLIT_K_FEW_TILES (H100).
SPLIT_K_BELOW_TILES = 200
SPLIT_K_FEWEST_TILES, SPLIT_K_FEW_TILES = 4, 2
GROUP_N = 8  # neighbouring N tiles per program group (L2 reuse of x and W)

# --- the lookup kernel (lookup.py) ---

@dataclass(frozen=True, slots=True)
class LookupConfig:
    block_m: int  # rows of x per tile (the MMA's N): 16, 32 or 64
    block_n: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    # Weight tiles by TMA where there is one (fp8_tiles.weight_loads): 0.2-2.2 us faster than pointer loads
    # at 8-32 rows, 2.3-5.7 us at 64 (H100).
    tma: bool = True


# The smallest of these row tiles that holds M runs (H100 sweep).
ROWS_16 = LookupConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)
ROWS_32 = LookupConfig(block_m=32, block_n=64, num_warps=4, num_stages=3)
ROWS_64 = LookupConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
# Rows of x per quantization program (one 256-K step each): 4 measured 0.3-4 us faster than 1 at 8-64 rows (H100).
LOOKUP_QUANTIZE_ROWS, LOOKUP_QUANTIZE_WARPS = 4, 4

# --- dynamic MXFP4 quantize-dequantize of activations (quant.py) ---

QUANTIZE_DEQUANTIZE_ROWS, QUANTIZE_DEQUANTIZE_BLOCK_K, QUANTIZE_DEQUANTIZE_WARPS = 16, 256, 4
