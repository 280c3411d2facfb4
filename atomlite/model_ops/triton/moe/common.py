"""What the two fused-MoE kernel families share (moe_gemm: pairs grouped by expert; moe_gemv: a few pairs, one
program each): the expert weights, their pointers, the inner activations' dynamic MXFP4 rounding and the sum of a
token's top_k rows."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.common import gdc_wait, pdl_launch, run_kernel
from atomlite.model_ops.triton.moe.tuning import SUM_SLOTS_BLOCK, SUM_SLOTS_WARPS
from atomlite.model_ops.triton.mxfp4.quant import quantize_blocks


MAX_GRID_TILES = 65535  # the grid's second axis (CUDA's limit, and HIP's)


def column_first_grid(tiles: int, column_blocks: int) -> tuple[int, int]:
    """The grouped GEMMs' grid (column blocks, row tiles): the programs of one row tile's column blocks launch
    together, so the rows they all read stay in L2. At 2040 tokens of 26B-A4B the down projection's input rows (23
    MB) otherwise left L2 between the column blocks that re-read them: TTFT 37.57, 37.19 -> 35.69, 35.78 ms (H200,
    bench latency, alternating); 512 tokens, batch-16 decode and MXFP4 experts unchanged."""
    if tiles > MAX_GRID_TILES:
        raise ValueError(f"{tiles} expert tiles in one step: at most {MAX_GRID_TILES} (fewer batched tokens a step, "
                         f"--max-num-batched-tokens)")
    return column_blocks, tiles


@dataclass(frozen=True)
class ExpertWeights:
    """One projection of all experts: float [E, N, K], or MXFP4 packed [E, N, K'/2] with scale [E, N, K'/32]."""
    weight: torch.Tensor
    scale: torch.Tensor | None = None
    wide_scales: bool = True  # MXFP4: some scale byte above mxfp4_gemm.FAST_MAX_SCALE_BYTE (always right)

    @property
    def mxfp4(self) -> bool:
        return self.scale is not None

    def strides(self) -> tuple[int, int, int, int]:
        scale = self.scale if self.mxfp4 else self.weight
        return self.weight.stride(0), self.weight.stride(1), scale.stride(0), scale.stride(1)


@triton.jit
def weight_pointers(w, w_scale, expert, rn, stride_we, stride_wn, stride_se, stride_sn, MXFP4: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """The first K tile of expert's rows rn: values, or packed bytes and their scale bytes."""
    # one return: Triton unifies the types of every return, constexpr branches included
    w_rows = w + expert.to(tl.int64) * stride_we + rn[:, None] * stride_wn
    if MXFP4:
        w_ptrs = w_rows + tl.arange(0, BLOCK_K // 2)[None, :]
        s_ptrs = w_scale + expert.to(tl.int64) * stride_se + rn[:, None] * stride_sn + tl.arange(0, BLOCK_K // 32)[
            None, :]
    else:
        w_ptrs = w_rows + tl.arange(0, BLOCK_K)[None, :]
        s_ptrs = w_ptrs
    return w_ptrs, s_ptrs


@triton.jit
def quantize_dequantize_rows(h, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Dynamic MXFP4 quantization of fp32 h [BLOCK_M, BLOCK_N] per 32 columns, back to fp32 values."""
    q, exponent = quantize_blocks(h, BLOCK_M, BLOCK_N)
    scale = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    return tl.reshape(tl.reshape(q, (BLOCK_M, BLOCK_N // 32, 32)) * scale[:, :, None], (BLOCK_M, BLOCK_N))


@triton.jit
def _sum_slots_kernel(pair_out, out, N, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()  # a dependent launch: for the kernel before, which wrote pair_out
    token = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        total += tl.load(pair_out + (token * TOP_K + slot) * N + rn, mask=rn < N, other=0.0)
    tl.store(out + token * N + rn, total.to(out.dtype.element_ty), mask=rn < N)


def sum_slots(pair_out: torch.Tensor, tokens: int, top_k: int, dtype: torch.dtype, dependent: bool = False,
              summed: bool = True) -> torch.Tensor | PartialSums:
    """out [tokens, hidden] = each token's top_k rows of pair_out summed in slot order; dependent: a programmatic
    dependent launch on the kernel before (sm_90). summed=False: the rows unsummed, as PartialSums (one slice per
    slot) for a norm kernel that adds them as it reads them."""
    hidden = pair_out.shape[1]
    if not summed:
        return PartialSums(pair_out.view(tokens, top_k, hidden).transpose(0, 1), dtype)
    out = torch.empty((tokens, hidden), dtype=dtype, device=pair_out.device)
    block = min(SUM_SLOTS_BLOCK, triton.next_power_of_2(hidden))
    run_kernel(_sum_slots_kernel, (tokens, triton.cdiv(hidden, block)), pair_out, out, hidden, TOP_K=top_k,
               BLOCK_N=block, PDL=dependent, num_warps=SUM_SLOTS_WARPS, **pdl_launch(dependent))
    return out
