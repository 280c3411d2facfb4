"""Launch constants of the skinny decode GEMM (skinny.py, and the MoE router that reuses its tiles): the one place to
read and retune them."""
from dataclasses import dataclass


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 2  # programs resident per multiprocessor (shared memory: stages x tiles)
    min_k_tiles: int = 4  # each split walks at least this many BLOCK_K tiles


MAX_ROWS = 16  # decode-sized batches; beyond, torch's GEMM (cuBLAS / hipBLASLt) wins
DEFAULT_CONFIG = SkinnyConfig(64, 128, 4, 4)
NARROW_K_CONFIG = SkinnyConfig(64, 64, 4, 4)  # K a multiple of 64 but not 128 (Gemma-4-26B-A4B's MLP down: 2112)
# More N tiles than DEFAULT_CONFIG splits K for (two programs per SM), up to WIDE_N_MAX_TILES_PER_SM per SM: 3 stages.
# Measured, not modelled (either depth keeps these tiles resident at once): H200, bench/decode_gemms.py --sweep
# --partial-sums, M = 1: 31B's global q+k 18432 x 5376 (288 tiles) 48.7 against 52.1 us, a TP=2 rank's gate_up
# 21504 x 5376 (336) 54.6 against 56.3; 256 tiles even (43.2 against 42.9); 31B's gate_up 43008 x 5376 (672) lost with
# 3 stages (116.6 against 107.9).
WIDE_N_CONFIG = SkinnyConfig(64, 128, 4, 3)
WIDE_N_MAX_TILES_PER_SM = 3

# The sum of the split-K partials: SUM_BLOCK outputs per program.
SUM_BLOCK = 1024
SUM_WARPS = 4
