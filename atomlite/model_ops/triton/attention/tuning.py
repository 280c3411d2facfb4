"""Launch constants of the attention kernels (paged attention, the split-KV merge, the KV write, q/k norm + RoPE):
the one place to read and retune them. Timings quoted are H100 / H200; the AMD tiles are bounded by the compile gate's
spill reports (python -m atomlite.cli plan --kernels --compile)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class AttnConfig:
    block_m: int  # rows per program: query positions x heads of one GQA group
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    num_splits: int = 1
    value_parts: int = 1  # programs that share a query tile, each computing 1 / value_parts of the output columns


# A batch whose longest query is at most DECODE_MAX_QUERY_LEN tokens (a decode step, or a verify step's newest token
# and its drafts) is decode-like: split-KV tiles; without the host's lengths, one with at most DECODE_QUERIES_PER_SEQ
# queries per sequence on average. A 5-token verify step of 31B at batch 1 took 2.8 ms of attention on prefill tiles
# (a few programs walking every key) against 0.64 ms for one token on split-KV tiles (H100).
DECODE_MAX_QUERY_LEN = 8
DECODE_QUERIES_PER_SEQ = 2
# From this head_dim on, decode tiles are the wide-head ones below.
WIDE_HEAD_DIM = 512

# NVIDIA decode (bench/decode_attention.py, H100 and H200): with few tiles per split the loop's software pipeline
# costs more than it hides (26B-A4B sliding layer at 544 keys: 7.9 us unpipelined against 13.5 with 3 stages), so
# a split walks up to SHORT_WALK key tiles unpipelined, or more with LONG_WALK_STAGES.
DECODE_BLOCK_M = 16
DECODE_MAX_BLOCK_M = 64  # a verify step's queries x GQA group in one program, up to this many rows
DECODE_BLOCK_N = 64
DECODE_BLOCK_N_WIDE_VALUES = 32  # 4-byte values (fp32, or any dtype under the interpreter)
DECODE_WARPS = 4
DECODE_WARPS_WIDE_HEAD = 8
# A launch of no more programs than multiprocessors (26B-A4B's sliding layers at batch 1: 8 KV heads x 16 splits):
# 8 warps. H200, batch 1, 16 splits (bench/decode_attention.py --tiles): 26B-A4B with 1024 keys in its window 6.5-6.7
# against 7.5-7.6 us, at 544 keys 6.4 against 6.3; 31B's 256 programs (16 KV heads) keep 4 warps, two programs a
# multiprocessor (8 warps: 10.4-11.0 against 8.3-8.6 us).
DECODE_WARPS_ALONE = 8
DECODE_MIN_TILES_PER_SPLIT = 1
# Wide heads (the global layers: keys rebuilt from V in the kernel, 8 warps) split up to 32 ways, beyond MAX_SPLITS
# while the programs fit one per multiprocessor (split_kv.num_splits): at batch 1 on an H200
# (bench/decode_attention.py --table-tokens 4096) 26B-A4B's global layer (2 KV heads) took 9.1 us at 2048 keys and 14.2
# at 4096 on 32 splits, against 13.1-14.0 and 21.1-23.3 on 16; 31B's (4) 9.8 and 15.0 against 13.6-14.9 and 23.5, and
# 18.3-23.8 at 4096 on 64 splits (two programs per multiprocessor). At 544 keys in that table 32 splits cost 0.6-0.9
# us more than 16 (empty splits).
DECODE_WIDE_HEAD_MAX_SPLITS = 32
# Wide heads where a launch holds more programs than multiprocessors: (keys per tile, warps, stages) whose shared
# memory lets two programs share one, so one's loads overlap the other's math (the key loop's copies are single
# buffered). Compiled for sm_90, 64 keys on 8 warps hold 134 KB (one a multiprocessor), 32 on 4 warps 78 KB. H200,
# 640 keys, 64/8/2 against these (bench/decode_attention.py --tiles): at batch 128, one split, 31B's global layer 196.2
# against 142.5 us, 26B-A4B's 104.4 against 74.1.
DECODE_SHARED_WIDE_HEAD = (32, 4, 2)
SHORT_WALK = 2
SHORT_WALK_STAGES, LONG_WALK_STAGES = 1, 2

# AMD decode: key tiles halved for head_dim >= WIDE_HEAD_DIM or 4-byte values; on gfx942, keys rebuilt from V or an
# fp8 cache widened hold more per lane, and only 16-key tiles fit (wider ones spilled 1-51 VGPRs).
ROCM_DECODE = AttnConfig(16, 64, 4, 3)
ROCM_DECODE_WIDE = AttnConfig(16, 32, 4, 3)
ROCM_DECODE_HEAVY_GFX942 = AttnConfig(16, 16, 4, 3)

# Prefill tiles by head_dim: (from this head_dim on, tiles for 2-byte values on NVIDIA, tiles for AMD or 4-byte
# values). AMD's MFMA layouts hold more of a tile per lane: the NVIDIA tiles spilled 98-379 VGPRs on gfx942 and
# gfx950 (compile gate), the halved key tiles fit in 203-223 with none spilled. A 512-wide head on NVIDIA splits its
# output columns over two programs (value_parts): 31B's global layer at 2048 tokens with built keys took 640 us
# against 850 on 64 x 32 tiles whole (H200, bench/prefill_attention.py).
PREFILL_TILES = [
    (512, AttnConfig(128, 32, 8, 2, value_parts=2), AttnConfig(64, 16, 8, 2)),
    (256, AttnConfig(128, 64, 8, 2), AttnConfig(64, 32, 8, 2)),
    (128, AttnConfig(128, 64, 8, 3), AttnConfig(128, 64, 8, 3)),
    (0, AttnConfig(128, 64, 4, 3), AttnConfig(128, 64, 4, 3)),
]
# AMD prefill with keys rebuilt from V or an fp8 cache widened: 32 x 16 tiles on 4 warps fit (larger ones spilled).
ROCM_PREFILL_HEAVY = AttnConfig(32, 16, 4, 2)
# NVIDIA prefill rebuilding 512-wide keys from V in the kernel (a prefill graph's sequences whose keys were not
# built): 32 x 32 tiles on 4 warps, 1141 us at 2048 tokens of 31B's global layer against 1586 on 64 x 32 / 8 warps;
# split value columns did not fit the shared memory (H200, bench/prefill_attention.py).
NVIDIA_PREFILL_DERIVED_WIDE = AttnConfig(32, 32, 4, 2)

# Split-KV: splits (a power of two, at most MAX_SPLITS) keep every program in one wave of about SPLIT_PROGRAMS_PER_SM
# per multiprocessor, each split walking at least MIN_TILES_PER_SPLIT key tiles: a partly filled second wave costs
# more than the splits gain. The merge kernel is compiled for MAX_SPLITS up to that many splits (one compile), beyond
# for the split count's power of two.
MAX_SPLITS = 16
MIN_TILES_PER_SPLIT = 4
SPLIT_PROGRAMS_PER_SM = 2
COMBINE_WARPS = 4

# Keys rebuilt from V once per prefill (build_keys): BUILD_KEYS_BLOCK positions a program.
BUILD_KEYS_BLOCK = 16
BUILD_KEYS_WARPS = 4

# KV write: one token a program; more warps for rows of more than KV_WRITE_SMALL_ROW values (all heads of a token).
KV_WRITE_SMALL_ROW = 4096
KV_WRITE_WARPS, KV_WRITE_WARPS_LARGE_ROW = 4, 8

# q/k norm + RoPE: prefill rows are short (one head), so from MANY_TOKENS on a program takes TOKENS_PER_PROGRAM
# tokens of a head at once (at 2048 tokens of 26B-A4B, one token a program ran 3x slower than its bytes), with
# MANY_TOKENS_WARP_FACTOR times the warps.
MANY_TOKENS, TOKENS_PER_PROGRAM = 64, 8
QK_NORM_ROPE_WARPS, QK_NORM_ROPE_WARPS_WIDE_HEAD = 2, 4
QK_NORM_ROPE_WIDE_HEAD_DIM = 512  # from this head_dim on, QK_NORM_ROPE_WARPS_WIDE_HEAD
MANY_TOKENS_WARP_FACTOR = 2
# Under TRITON_INTERPRET=1 a program costs Python time per operation, not GPU time: up to this many tokens a program.
INTERPRETER_TOKENS_PER_PROGRAM = 64

# Encoder attention (encoder.py: bidirectional within each packed sequence, no cache), by the head's dot columns
# (encoder.padded_head_dim): (from this many on, 2-byte values on NVIDIA, 2-byte values on AMD, 4-byte values or the
# interpreter). The 31B tower's 72 is computed as 64 + 16 columns (80: the narrow tiles); 64 stays 64. The NVIDIA tiles are the prefill tiles of the same
# width (PREFILL_TILES); on AMD the 128-wide tile with 3 stages spilled 2 VGPRs on gfx950 (compile gate), with 2 it
# holds 243 and spills none; the 64 + 16 split on 4 warps held 268 registers on gfx950 (occupancy 1, 114 scalar
# spills), on 8 warps 198-207 (occupancy 2); 4-byte tiles are halved so the K/V stages fit NVIDIA's shared memory.
ENCODER_TILES = [
    (128, AttnConfig(128, 64, 8, 3), AttnConfig(128, 64, 8, 2), AttnConfig(64, 32, 4, 2)),
    (80, AttnConfig(128, 64, 4, 3), AttnConfig(128, 64, 8, 2), AttnConfig(64, 32, 4, 2)),
    (0, AttnConfig(128, 64, 4, 3), AttnConfig(128, 64, 4, 3), AttnConfig(64, 32, 4, 2)),
]
ENCODER_MAX_HEAD_DIM = 128
# Whether 2-byte values split a head that is no power of two (72 = 64 + 16) rather than pad it whole to 128, by
# platform kind. Off for now: on an H200 (2026-11-28) the split bf16 kernel (128 x 64 tiles, 4 warps, 3 stages) hit an
# illegal memory access in about half the runs at 10080 patches (bench/encoder_attention.py, the GPU test), though
# every load and store is masked in its PTX; fp32 (the 64 x 32 FMA tiles) passed there, and the interpreter tests pass.
# It looks like Triton's Hopper wgmma bug with several dots on narrow tiles (triton-lang/triton#11366, #10573: illegal
# memory accesses from 3.6 on, clean on 3.5.1; the GPU image has 3.6). bench/encoder_attention.py --split times it
# against padding (run it in its own process: an illegal access poisons the CUDA context).
ENCODER_SPLIT_HEADS = {"cuda": False, "rocm": False}

# A vision tower's q/k/v norms + 2-D RoPE (axial_norm_rope.py): rows of one head a program (72 wide, padded to 128),
# the 2304 x 48 heads of an 896x896 image on the 31B tower in 144 x 48 programs. Not yet timed.
AXIAL_TOKENS_PER_PROGRAM = 16
AXIAL_WARPS = 4
