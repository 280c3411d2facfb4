"""Launch constants of the LoRA shrink and expand kernels (gathered.py): the one place to read and retune them.

Decode-sized batches make each kernel a stream of one slot's A or B per row; bench/lora_kernels.py times each
projection's pair against its GEMM on a GPU (and sweeps the expand's tiles), bench/lora_tpot.py the whole step."""
SHRINK_BLOCK_R = 16  # ranks per program (of slices x max_lora_rank)
SHRINK_BLOCK_K = 256  # input columns per iteration
SHRINK_WARPS = 4
SHRINK_PROGRAMS_PER_SM = 4  # the shrink's K is split until this many programs per multiprocessor run
SHRINK_MIN_K_STEPS = 2  # each K slice at least this many BLOCK_K steps
EXPAND_BLOCK_N = 128  # output columns per program
EXPAND_WARPS = 4
# Wide projections (Gemma-4-31B's gate_up: 43008 columns) at 128 columns made ~5000 programs at batch 16, each a
# chain of dependent loads: the expand took 14.4 us against the shrink's 3.7 (H200). Wider tiles for them.
EXPAND_WIDE_N = 8192  # projections at least this wide take the wide tile
EXPAND_WIDE_BLOCK_N = 512
EXPAND_WIDE_WARPS = 8
