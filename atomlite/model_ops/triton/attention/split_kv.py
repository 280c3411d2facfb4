"""Split-KV (flash-decoding): when a decode batch has too few (sequence, KV head) pairs to fill the GPU, each pair's
keys are cut into splits that run in parallel; this merges their partial outputs by their log-sum-exps."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.attention.tuning import (COMBINE_WARPS, MAX_SPLITS, MIN_TILES_PER_SPLIT,
                                                        SPLIT_PROGRAMS_PER_SM)
from atomlite.model_ops.triton.common import (dependent_launches, gdc_launch_dependents, gdc_wait, num_sms, pdl_launch,
                                              run_kernel)
from atomlite.model_ops.carriers import QuantizedRows
from atomlite.model_ops.triton.mxfp4.fp8_tiles import store_quantized


def num_splits(device: torch.device, num_pairs: int, max_keys: int, block_n: int,
               min_tiles: int = MIN_TILES_PER_SPLIT, max_splits: int = MAX_SPLITS) -> int:
    """The most splits (a power of two, at most max_splits) that keep all programs in one wave of about
    SPLIT_PROGRAMS_PER_SM per multiprocessor, each still walking min_tiles key tiles: a partly filled second wave costs
    more than the splits gain. Beyond MAX_SPLITS (where max_splits allows) only while the programs fit one per
    multiprocessor."""
    splits = 1
    affordable = max_keys // (block_n * min_tiles)
    while splits * 2 <= min(affordable, max_splits):
        per_sm = SPLIT_PROGRAMS_PER_SM if splits * 2 <= MAX_SPLITS else 1
        if num_pairs * splits * 2 > per_sm * num_sms(device):
            break
        splits *= 2
    return splits


@triton.jit
def _combine_kernel(part_out, part_lse, out, lse, xq, x_scale, num_splits, num_heads,
                    stride_ps, stride_ls, stride_ot, stride_oh, stride_qm, stride_sm,
                    SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                    STORE_LSE: tl.constexpr, PERIOD: tl.constexpr, PDL: tl.constexpr):
    """PERIOD > 0: the output row [T, H * D] goes to xq / x_scale, quantized as mxfp4_gemm_fp8 reads it. PDL: a
    dependent launch that lets the kernel after it (the output projection) start and read its weights."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # for the attention kernel's partials
    token = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P2)
    dims = tl.arange(0, HEAD_DIM)
    row = token * num_heads + head
    split_lse = tl.load(part_lse + splits * stride_ls + row, mask=splits < num_splits, other=float("-inf"))
    # Every query sees at least its own key, so some split is non-empty and top is finite.
    top = tl.max(split_lse, 0)
    weight = tl.exp(split_lse - top)
    total = tl.sum(weight, 0)
    parts = tl.load(part_out + splits[:, None] * stride_ps + row * HEAD_DIM + dims[None, :],
                    mask=(splits < num_splits)[:, None], other=0.0)
    merged = tl.sum(parts * (weight / total)[:, None], 0).to(out.dtype.element_ty)
    if PERIOD > 0:  # this head's columns of the row, rounded as the output would be
        tile = tl.reshape(merged.to(tl.float32), (1, HEAD_DIM))
        store_quantized(xq, x_scale, tile, token + tl.arange(0, 1), head * HEAD_DIM, token + 1,
                        num_heads * HEAD_DIM, stride_qm, stride_sm, PERIOD, 1, HEAD_DIM)
    else:
        tl.store(out + token * stride_ot + head * stride_oh + dims, merged)
    if STORE_LSE:
        tl.store(lse + row, top + tl.log(total))


def combine(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
            quantized: QuantizedRows | None = None) -> None:
    """part_out [S, T, H, D] fp32 (each split normalised), part_lse [S, T, H] -> out [T, H, D], lse [T, H]; with
    quantized (its K = H * D, D a multiple of 32) the output goes there instead of out."""
    splits, num_tokens, num_heads, head_dim = part_out.shape
    values, scales = (quantized.values, quantized.scales) if quantized is not None else (out, out)
    pdl = dependent_launches(part_out.device)
    run_kernel(_combine_kernel, (num_tokens, num_heads),
        part_out, part_lse, out, lse if lse is not None else part_lse, values, scales, splits, num_heads,
        part_out.stride(0), part_lse.stride(0), out.stride(0), out.stride(1), values.stride(0), scales.stride(0),
        SPLITS_P2=max(MAX_SPLITS, triton.next_power_of_2(splits)), HEAD_DIM=head_dim,
        STORE_LSE=lse is not None, PERIOD=quantized.period if quantized is not None else 0, PDL=pdl,
        num_warps=COMBINE_WARPS,
        **pdl_launch(pdl))
