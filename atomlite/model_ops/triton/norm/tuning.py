"""Launch constants of the norm kernels (rms_norm, rms_norm_residual): the one place to read and retune them."""

# rms_norm: a program takes whole rows, up to RMS_MAX_ROWS of them and about RMS_PROGRAM_VALUES values in all; one
# warp per RMS_VALUES_PER_WARP of the program's values, at most MAX_WARPS.
RMS_MAX_ROWS = 16
RMS_PROGRAM_VALUES = 2048
RMS_VALUES_PER_WARP = 512
# Under TRITON_INTERPRET=1 every program costs Python time, not GPU time: fewer, larger programs.
INTERPRETER_MAX_ROWS = 64
INTERPRETER_PROGRAM_VALUES = 16384

# rms_norm_residual: one row a program, one warp per RESIDUAL_VALUES_PER_WARP of the row, at most MAX_WARPS.
RESIDUAL_VALUES_PER_WARP = 256

MAX_WARPS = 16
# Except a few rows written as TokenRows on NVIDIA: at 16 warps a thread holds 16 of 31B's 8192 (padded) values and
# the fp8 store first converts their layout through shared memory; at 32 warps (1024 threads) it holds 8 and converts
# none. 31B's one-row update 3.7 against 4.1 us at 16; from 64 rows 32 warps were slower (5.0 against 4.3), as they
# were for bf16 rows (H200, bench/norm_warps.py).
TOKEN_ROWS_MAX_WARPS, TOKEN_ROWS_FEW_ROWS = 32, 16
