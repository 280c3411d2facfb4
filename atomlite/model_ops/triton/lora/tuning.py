"""Launch constants of the LoRA shrink and expand kernels (gathered.py): the one place to read and retune them.

Not yet timed on a GPU: decode-sized batches make each kernel a stream of one slot's A or B per row, so tiles are
sized to keep a few hundred programs in flight at batch 16 (bench/lora_tpot.py measures the end-to-end cost)."""
SHRINK_BLOCK_R = 16  # ranks per program (of slices x max_lora_rank)
SHRINK_BLOCK_K = 256  # input columns per iteration
SHRINK_WARPS = 4
SHRINK_PROGRAMS_PER_SM = 4  # the shrink's K is split until this many programs per multiprocessor run
SHRINK_MIN_K_STEPS = 2  # each K slice at least this many BLOCK_K steps
EXPAND_BLOCK_N = 128  # output columns per program
EXPAND_WARPS = 4
