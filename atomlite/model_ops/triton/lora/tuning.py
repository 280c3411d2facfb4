"""Launch constants of the LoRA shrink and expand kernels (gathered.py): the one place to read and retune them.

Decode-sized batches make each kernel a stream of one slot's A or B per row; bench/lora_kernels.py times each
projection's pair against its GEMM on a GPU (and sweeps the expand's tiles), bench/lora_tpot.py the whole step."""
SHRINK_BLOCK_R = 16  # ranks per program (of slices x max_lora_rank)
SHRINK_BLOCK_K = 256  # input columns per iteration
SHRINK_WARPS = 4
SHRINK_PROGRAMS_PER_SM = 4  # the shrink's K is split until this many programs per multiprocessor run
SHRINK_MIN_K_STEPS = 2  # each K slice at least this many BLOCK_K steps
# H200, Gemma-4-31B at batch 16 (bench/lora_kernels.py --sweep-expand): 256 columns on 4 warps was the fastest or
# within 0.1 us of it for every projection (gate_up 10.9 us against 14.0 at 128; qkv 5.8 against 7.1)
EXPAND_BLOCK_N = 256  # output columns per program
EXPAND_WARPS = 4
