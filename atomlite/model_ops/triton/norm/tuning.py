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
