"""FP8 GEMM y = q(x) W^T with the checkpoint's activation quantization fused into the kernel (portable Triton).

Each program computes a [BLOCK_M, BLOCK_N] tile. Its x rows are quantized as the K loop reads them: per token
(a first pass over K finds each row's amax), per group of BLOCK_K (= the group size), or with the static input
scale; then fp8 x fp8 tensor-core dots accumulate in fp32. Weights are e4m3 with atomlite's float32 scales
[N, G] (quant.fp8): one column (per tensor or channel) is applied once at the end, block columns at each K block.
Weight-only layers (W8A16) dot x in its own dtype with the weights widened (e4m3 values are exact in bf16).

Rounding to e4m3 is done in fp32 on the bits (round half to even on the e4m3fn grid, then an exact cast): the
same on every GPU and in the interpreter, whose fp8 conversion rounds wrongly. On an e4m3fnuz GPU (gfx942) the
same bits are half the value, so the quantized x is halved before the cast and its scale doubled, and the
weights were converted at load (quant.fp8.to_e4m3fnuz): the results are those of the checkpoint's e4m3fn.
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import interpreting, run_kernel

ACT_NONE, ACT_STATIC, ACT_TOKEN, ACT_GROUP = 0, 1, 2, 3
ACT_CODES = {None: ACT_NONE, "static": ACT_STATIC, "token": ACT_TOKEN, "group": ACT_GROUP}
E4M3_MAX = 448.0
FP32_EPS = 1.1920928955078125e-07  # a zero row's scale (compressed-tensors' eps): its values quantize to zeros


@triton.jit
def round_e4m3(v):
    """v (fp32, |v| <= 448) rounded half-to-even onto the e4m3fn grid, as fp32."""
    a = tl.abs(v)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    # below 2^-6 the grid is 2^-9 apart; adding 1.5 * 2^23 rounds to an integer half to even
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)
    r = tl.where(a >= 0.015625, normal, sub)
    return tl.where(v < 0, -r, r)


@triton.jit
def _quantize(x, scale, FNUZ: tl.constexpr, FP8: tl.constexpr):
    q = round_e4m3(tl.minimum(tl.maximum(x / scale, -448.0), 448.0))
    if FNUZ:
        q = q * 0.5
    return q.to(FP8)


@triton.jit
def fp8_gemm_kernel(x_ptr, w_ptr, ws_ptr, in_scale_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                    stride_wsn, ACT: tl.constexpr, BLOCK_SCALED: tl.constexpr, SCALE_BLOCK_K: tl.constexpr,
                    FNUZ: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm[:, None] * stride_xm
    w_rows = w_ptr + rn[None, :] * stride_wn
    x_factor = 2.0 if FNUZ else 1.0  # fnuz holds half the value: the activation's scale doubles

    row_scale = tl.full((BLOCK_M,), 1.0, tl.float32)
    if ACT == 1:
        row_scale = row_scale * tl.load(in_scale_ptr).to(tl.float32)
    if ACT == 2:  # per token: the row's amax over all of K first
        amax = tl.zeros((BLOCK_M,), tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + rk
            x = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & (kk[None, :] < K), other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        row_scale = amax / 448.0
        row_scale = tl.where(row_scale == 0.0, 1.1920928955078125e-07, row_scale)

    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + rk
        k_ok = kk < K
        x = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
        if ACT == 0:
            if FP32_DOT:
                part = tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                part = tl.dot(x, w.to(x.dtype))
        else:
            xf = x.to(tl.float32)
            if ACT == 3:  # per group of BLOCK_K along K: its own scale, applied to this block's product
                group_scale = tl.max(tl.abs(xf), axis=1) / 448.0
                group_scale = tl.where(group_scale == 0.0, 1.1920928955078125e-07, group_scale)
                part = tl.dot(_quantize(xf, group_scale[:, None], FNUZ, w_ptr.dtype.element_ty), w) * (group_scale * x_factor)[:, None]
            else:
                part = tl.dot(_quantize(xf, row_scale[:, None], FNUZ, w_ptr.dtype.element_ty), w)
        if BLOCK_SCALED:
            ws = tl.load(ws_ptr + rn * stride_wsn + k // SCALE_BLOCK_K, mask=n_ok, other=0.0)
            part = part * ws[None, :]
        acc += part

    if not BLOCK_SCALED:
        acc = acc * tl.load(ws_ptr + rn * stride_wsn, mask=n_ok, other=0.0)[None, :]
    if ACT == 1 or ACT == 2:
        acc = acc * (row_scale * x_factor)[:, None]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def block_sizes(m: int, activation: str | None, group_size: int, scale_block_k: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): BLOCK_K is the activation group, and divides the weight's scale block."""
    block_k = group_size if activation == "group" else min(128, scale_block_k or 128)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    return block_m, 64, block_k


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor | None,
             activation: str | None, group_size: int = 128, scale_block_k: int = 0) -> torch.Tensor:
    """x [M, K] @ W^T -> [M, N] in x's dtype; weight [N, K] fp8 (e4m3fn, or e4m3fnuz converted at load) with
    scales [N, G]; scale_block_k: K per scale column when G > 1."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_m, block_n, block_k = block_sizes(m, activation, group_size, scale_block_k)
    fnuz = weight.dtype == torch.float8_e4m3fnuz
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    run_kernel(fp8_gemm_kernel, grid, x, weight, scale, input_scale if input_scale is not None else scale, y,
               m, n, k, x.stride(0), weight.stride(0), y.stride(0), scale.stride(0),
               ACT=ACT_CODES[activation], BLOCK_SCALED=scale.shape[1] > 1, SCALE_BLOCK_K=scale_block_k or k,
               FNUZ=fnuz, FP32_DOT=interpreting() or x.dtype == torch.float32, BLOCK_M=block_m,
               BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return y
