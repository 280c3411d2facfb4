"""Launch constants of the fused MoE kernels (routing, grouped GEMMs, few-pair GEMVs, router): the one place to read
and retune them. Sweeps are bench/moe_layer.py --sweep and bench/router.py."""
from dataclasses import dataclass

# --- the grouped GEMMs (gemm.py): (token, slot) pairs grouped by expert into tiles of block_m rows ---

@dataclass(frozen=True, slots=True)
class ProjectionTiles:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """block_m rows per tile (shared by both projections: the routing's tiles); per projection its N and K tiles.
    tail_m < block_m: a tile of at most tail_m rows (an expert's last) multiplies only those (a second code path in
    each kernel)."""
    block_m: int
    gate_up: ProjectionTiles
    down: ProjectionTiles
    tail_m: int = 0

    def __post_init__(self):
        if not self.tail_m:
            object.__setattr__(self, "tail_m", self.block_m)


# Decode reads each routed expert's weights once: small N tiles give every SM a share of the stream. Prefill tiles
# grow with the rows each expert gets. All fit gfx942's LDS and sm_90 (compile gate). NVIDIA_PREFILL at 2048 tokens
# of 26B-A4B (H100, graphs): 1054 us bf16 and 1157 us MXFP4, against 1145 and 1249 us for PREFILL; ROCm keeps
# PREFILL until tiles are timed on an MI300X / MI355X (the NVIDIA ones compile there with 2-3 waves per SIMD against
# PREFILL's 4-8).
DECODE = MoeConfig(16, gate_up=ProjectionTiles(32, 128, 4, 3), down=ProjectionTiles(64, 64, 4, 3))
MEDIUM = MoeConfig(32, gate_up=ProjectionTiles(64, 64, 4, 3), down=ProjectionTiles(64, 64, 4, 3))
PREFILL = MoeConfig(64, gate_up=ProjectionTiles(64, 64, 8, 3), down=ProjectionTiles(128, 64, 8, 3))
NVIDIA_PREFILL = MoeConfig(64, gate_up=ProjectionTiles(128, 64, 4, 4), down=ProjectionTiles(256, 64, 4, 4))
# From about 128 rows an expert (26B-A4B at 2048 tokens), 128-row tiles with 8 warps: gate_up 436 and down 228 us
# against NVIDIA_PREFILL's 453 and 263 (H200, bench/moe_layer.py --projections, each projection alone). bf16 and
# fp16 weights only: MXFP4 experts were not timed with these tiles.
# Tail tiles (an expert's last, of at most tail_m rows, multiplying only those): at 2048 tokens of 26B-A4B the op
# takes 666 us against 721 without (H200, bench/moe_layer.py --tails; gate_up 395 against 421). Little more: each
# tile still streams its expert's whole weight block from L2, which bounds these kernels more than the multiplies.
# gate_up's last column block multiplies only the columns left (gemm._tail_columns: 26B-A4B's 704 on 128-wide tiles
# leaves 64), with the overlap of the dense MLP at prefill (branches.overlaps): TTFT of 2040 tokens 38.6 -> 37.4 ms
# (H200, bench/README).
NVIDIA_LARGE_PREFILL = MoeConfig(128, gate_up=ProjectionTiles(128, 64, 8, 4), down=ProjectionTiles(256, 64, 8, 4),
                                 tail_m=64)
# 512 tokens of 26B-A4B (32 rows an expert): 445 against 479 us with tails of 16 rows (MXFP4 weights: 733 either way)
NVIDIA_MEDIUM = MoeConfig(MEDIUM.block_m, MEDIUM.gate_up, MEDIUM.down, tail_m=16)
DECODE_MAX_ROWS_PER_EXPERT, MEDIUM_MAX_ROWS_PER_EXPERT = 8, 48  # pairs per expert up to which DECODE, MEDIUM run
LARGE_MIN_ROWS_PER_EXPERT = 96  # pairs per expert from which NVIDIA_LARGE_PREFILL runs (unquantized experts)
ROCM_MAX_STAGES = 2  # LDS: 64 KiB on gfx942
# fp32 tiles take twice the shared memory: NVIDIA_PREFILL's down on 3 stages needs 240 KiB (H100: 227)
FP32_MAX_STAGES = 2

# --- routing (routing.py) ---

PAIR_CHUNK = 64  # pairs per one-hot [PAIR_CHUNK, experts] step
TILE_CHUNK = 64  # tile-table entries written per step
# chunk counts each placing program reads a step: every program reads every chunk's counts (a prefill of 2048 tokens
# of 26B-A4B: 256 chunks of 128 experts), COUNT_ELEMENTS // experts rows a step (32 there), not a row a step
COUNT_ELEMENTS = 4096
ONE_PROGRAM_MAX_PAIRS = 512  # up to this many pairs one program counts and places them all: a single launch
ROUTING_WARPS = 4

# --- few pairs, one program each (gemv.py, gemv_fp8.py) ---

@dataclass(frozen=True, slots=True)
class GemvTiles:
    block_n: int
    block_k: int
    num_warps: int


@dataclass(frozen=True, slots=True)
class GemvConfig:
    gate_up: GemvTiles
    down: GemvTiles


GEMV_MAX_PAIRS = 32  # beyond, experts repeat often enough that reading each once (the grouped GEMMs' tiles) wins
# Enough programs for every SM at one token (8 pairs): 704 / 16 x 8 gate_up and 2816 / 32 x 8 down programs on
# Gemma-4-26B-A4B.
GEMV_BF16 = GemvConfig(GemvTiles(16, 256, 4), GemvTiles(32, 64, 4))
GEMV_MXFP4 = GemvConfig(GemvTiles(16, 256, 4), GemvTiles(32, 128, 4))
# A float down whose K (the experts' inner size) fits one tile: each row in one load, nothing loaded ahead (26B-A4B's
# K = 704 in 1024-wide tiles: 13.7 against 15.4 us alone, bench/moe_layer.py --kernels on an H100)
GEMV_ONE_TILE_DOWN = GemvTiles(8, 1024, 4)
INTERPRETER_GEMV_MAX_BLOCK_N = 256  # under TRITON_INTERPRET=1: output features a program takes at most


@dataclass(frozen=True, slots=True)
class Fp8GemvConfig:
    gate_up_block_n: int  # rows of [gate | up] per program
    down_block_n: int
    num_stages: int = 3
    # K ranges of gate_up in separate programs (the inner quantization sums them); None: the fewest that give
    # every multiprocessor FP8_GEMV_PROGRAMS_PER_SM programs (one token: 2 splits; measured 20.0 us against 21.8 for
    # one, H100)
    gate_up_splits: int | None = None


# 22 x 8 gate_up and 44 x 8 down programs at one token of 26B-A4B; 64-row tiles take Hopper's warpgroup MMAs, where
# 16 and 32 rows ran 1.7-2x slower (H100)
FP8_GEMV = Fp8GemvConfig(64, 64)
FP8_GEMV_PROGRAMS_PER_SM = 2
FP8_GEMV_WARPS = 4

# --- the sum of each token's top_k rows (common.py) ---

SUM_SLOTS_BLOCK, SUM_SLOTS_WARPS = 1024, 4

# --- the router (router.py) ---

# The one-launch router up to ROUTER_MAX_ROWS tokens: its last program picks each row's experts in turn; apart, 3
# launches beat it from 4 rows (H100).
ROUTER_MAX_ROWS = 2
ROUTER_MAX_SPLITS = 32  # K slices of the logits GEMM
ROUTER_WARPS = 4
ROUTER_TOPK_WARPS = 4
