"""y = x W^T for decode-sized batches (a few rows): the whole cost is streaming W once, so each program owns
BLOCK_N rows of W over one slice of K, and the K slices (split-K) multiply the programs until they fill the GPU; a
second kernel adds the slices' fp32 partials. Larger batches go to torch (cuBLAS / hipBLASLt), which wins there.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.triton.common import (dependent_launches, gdc_wait, interpreting, num_sms, pdl_launch,
                                              run_kernel)
from atomlite.model_ops.triton.gemm.tuning import (DEFAULT_CONFIG, MAX_ROWS, NARROW_K_CONFIG, SUM_BLOCK, SUM_WARPS,
                                                   WIDE_N_CONFIG, WIDE_N_MAX_TILES_PER_SM, SkinnyConfig)
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.gemm import tuning


def config_for(n: int, k: int, device: torch.device) -> SkinnyConfig:
    """The tiles for W [n, k]: NARROW_K_CONFIG for a K that 128-wide tiles do not divide; WIDE_N_CONFIG for more N
    tiles than DEFAULT_CONFIG splits K for, up to WIDE_N_MAX_TILES_PER_SM a multiprocessor (tuning.py)."""
    if k % DEFAULT_CONFIG.block_k:
        return NARROW_K_CONFIG
    tiles, sms = n // DEFAULT_CONFIG.block_n, num_sms(device)
    if DEFAULT_CONFIG.programs_per_sm * sms < tiles <= WIDE_N_MAX_TILES_PER_SM * sms:
        return WIDE_N_CONFIG
    return DEFAULT_CONFIG


@triton.jit
def split_k_tile(x, w, M, K, k_per_split, stride_xm, stride_wn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """This program's tile of x W^T: rows BLOCK_N * program_id(0) + [0, BLOCK_N) of W over K slice program_id(1),
    fp32 [BLOCK_M, BLOCK_N]; returned with its row indices into x and W. PDL: a dependent launch, which reads its
    first W tile before it waits for the kernel ahead (that wrote x; no kernel writes W), so the tile streams in
    while that kernel finishes."""
    rows_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.arange(0, BLOCK_M)
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # N % BLOCK_N == 0 and K % BLOCK_K == 0 (the launchers check): only x's rows need a mask.
    if PDL:
        cols = k_lo + tl.arange(0, BLOCK_K)
        live = (cols < k_hi)[None, :]  # a split past K has no tile
        w_tile = tl.load(w + rows_n[:, None] * stride_wn + cols[None, :], mask=live, other=0.0)
        gdc_wait()
        x_tile = tl.load(x + rows_m[:, None] * stride_xm + cols[None, :], mask=(rows_m[:, None] < M) & live,
                         other=0.0)
        acc = tl.dot(x_tile, tl.trans(w_tile), acc)
        k_lo += BLOCK_K
    for k in range(k_lo, k_hi, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        w_tile = tl.load(w + rows_n[:, None] * stride_wn + cols[None, :])
        x_tile = tl.load(x + rows_m[:, None] * stride_xm + cols[None, :], mask=rows_m[:, None] < M, other=0.0)
        if UPCAST:
            w_tile = w_tile.to(tl.float32)
            x_tile = x_tile.to(tl.float32)
        acc = tl.dot(x_tile, tl.trans(w_tile), acc)
    return acc, rows_m, rows_n


@triton.jit
def _skinny_gemm_kernel(x, w, out, part, M, N, K, k_per_split, stride_xm, stride_wn, stride_om, stride_ps,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                        UPCAST: tl.constexpr, PDL: tl.constexpr):
    split = tl.program_id(1)
    acc, rows_m, rows_n = split_k_tile(x, w, M, K, k_per_split, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K,
                                       UPCAST, PDL)
    mask = (rows_m[:, None] < M)
    if SPLIT:
        tl.store(part + split * stride_ps + rows_m[:, None] * N + rows_n[None, :], acc, mask=mask)
    else:
        tl.store(out + rows_m[:, None] * stride_om + rows_n[None, :], acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _sum_splits_kernel(part, out, M, N, splits, stride_ps, stride_om, SPLITS_P2: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    s = tl.arange(0, SPLITS_P2)
    mask = (s[:, None] < splits) & (cols[None, :] < N)
    parts = tl.load(part + s[:, None] * stride_ps + row * N + cols[None, :], mask=mask, other=0.0)
    tl.store(out + row * stride_om + cols, tl.sum(parts, 0).to(out.dtype.element_ty), mask=cols < N)


def fits(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig = DEFAULT_CONFIG) -> bool:
    """Whether the skinny kernel takes this call (else torch's GEMM runs it)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    n, k = weight.shape
    return (0 < rows <= MAX_ROWS and n % config.block_n == 0 and k % config.block_k == 0
            and weight.stride(1) == 1 and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16))


def num_splits(n: int, k: int, device: torch.device, config: SkinnyConfig) -> int:
    """The most K splits that keep every program in one wave of programs_per_sm per multiprocessor (a partial
    second wave would cost more than the splits gain), each split walking at least min_k_tiles tiles."""
    tiles, k_tiles = n // config.block_n, k // config.block_k
    slots = config.programs_per_sm * num_sms(device)
    return max(1, min(slots // tiles, k_tiles // config.min_k_tiles))


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig = DEFAULT_CONFIG,
                summed: bool = True) -> torch.Tensor | PartialSums:
    """x [..., K] @ weight [N, K]^T for up to MAX_ROWS rows of x (fits() must hold). summed=False: with K split,
    the unsummed PartialSums of 2-D x (for a consumer that adds them)."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m, k = rows.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    splits = num_splits(n, k, x.device, config)
    k_per_split = triton.cdiv(k // config.block_k, splits) * config.block_k
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    pdl = dependent_launches(x.device)
    run_kernel(
        _skinny_gemm_kernel, (n // config.block_n, splits), rows, weight, out, part, m, n, k, k_per_split,
        rows.stride(0), weight.stride(0), out.stride(0), part.stride(0) if splits > 1 else 0, BLOCK_M=16,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT=splits > 1, UPCAST=interpreting(), PDL=pdl, num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl_launch(pdl))
    if splits > 1 and not summed and x.dim() == 2:
        return PartialSums(part, x.dtype)
    if splits > 1:
        run_kernel(_sum_splits_kernel, (m, triton.cdiv(n, SUM_BLOCK)), part, out, m, n, splits, part.stride(0),
                   out.stride(0), SPLITS_P2=triton.next_power_of_2(splits), BLOCK=SUM_BLOCK, num_warps=SUM_WARPS)
    return out.reshape(*x.shape[:-1], n)


def linear(x: torch.Tensor, weight: torch.Tensor, summed: bool = True) -> torch.Tensor | PartialSums:
    """Same contract as torch_ref.linear: the skinny kernel for decode-sized batches, torch's GEMM otherwise."""
    config = config_for(*weight.shape, x.device)
    if fits(x, weight, config):
        return skinny_gemm(x, weight, config, summed=summed)
    return F.linear(x, weight)


def _refuses(platform, shape: dict) -> str | None:
    if platform.kind == "rocm":
        return "the skinny decode GEMM is measured against cuBLAS only, not yet against hipBLASLt"
    return None


# the skinny split-K kernel for decode-sized batches, torch's GEMM beyond
declare("linear", "triton", linear, refuses=_refuses, tuning=tuning, capabilities={"writes_partial_sums"})
