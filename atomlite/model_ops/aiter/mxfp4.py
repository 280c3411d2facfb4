"""MXFP4 linear on AITER's gemm_a4w4 (gfx950 only): the weight re-layout done once at load, in plain torch, and
the per-call adapter.

What gemm_a4w4(bpreshuffle=True) reads (AITER ops/gemm_op_a4w4.py, op_tests/test_gemm_a4w4.py):
  B        fp4x2 [N, K/2], pre-shuffled in (16, 16) tiles: view [N/16, 16, K/64, 2, 16], dims (n0, n1, k0, k1, k2)
           reordered to (n0, k0, k1, n1, k2). Needs N % 16 == 0 and (K/2) % 32 == 0.
  B_scale  e8m0 [pad256(N), pad8(K/32)], shuffled: view [rows/32, 2, 16, cols/8, 2, 4], dims (a, b, c, d, e, f)
           reordered to (a, d, f, c, e, b).
  A, A_scale   the same for the activation, from utility.fp4_utils.dynamic_mxfp4_quant(shuffle=True), whose "even"
           scale rounding is Quark's (round amax to a power of two by adding 0x200000 to its fp32 bits).
  out      [pad32(M), N]: 0.1.7 takes it as an argument, HEAD allocates it; both return M rows after slicing.
K is padded to 256 at load: 64 would satisfy the shuffle, 256 makes K/32 a multiple of 8 so the scale needs no
column padding (AITER's own shuffle pads with uninitialised bytes; ours pads with 127, i.e. 2^0, over zero weights).
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as nnf

from atomlite.model_ops.aiter import detect, functions as F
from atomlite.model_ops.kernels import declare
from atomlite.quant.mxfp4 import E8M0_BIAS as UNIT_SCALE, pad_k

K_ALIGN = 256
M_ALIGN = 32
N_ALIGN = 16
SCALE_ROW_ALIGN = 256
SCALE_COL_ALIGN = 8
FP4X2 = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_rows(x: torch.Tensor, multiple: int, value: int = 0) -> torch.Tensor:
    return nnf.pad(x, (0, 0, 0, round_up(x.shape[0], multiple) - x.shape[0]), value=value)


def shuffle_weight(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> the (16, 16)-tiled order gemm_a4w4 reads with bpreshuffle=True (same shape)."""
    n, kb = weight.shape
    if n % N_ALIGN or kb % 32:
        raise ValueError(f"gemm_a4w4's weight shuffle needs N % 16 == 0 and K % 64 == 0, got N={n}, K={kb * 2}")
    tiles = weight.reshape(n // 16, 16, kb // 32, 2, 16)
    return tiles.permute(0, 2, 3, 1, 4).contiguous().reshape(n, kb)


def shuffle_scale(scale: torch.Tensor) -> torch.Tensor:
    """uint8 e8m0 [R, C] -> padded to [pad256(R), pad8(C)] with unit scales, then shuffled for gemm_a4w4."""
    rows = pad_rows(scale, SCALE_ROW_ALIGN, UNIT_SCALE)
    padded = nnf.pad(rows, (0, round_up(scale.shape[1], SCALE_COL_ALIGN) - scale.shape[1]), value=UNIT_SCALE)
    r, c = padded.shape
    return padded.reshape(r // 32, 2, 16, c // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous().reshape(r, c)


@dataclass(frozen=True)
class PreparedWeight:
    weight: torch.Tensor  # fp4x2 view [N, Kp/2], shuffled
    scale: torch.Tensor  # e8m0 view [pad256(N), Kp/32], shuffled
    in_features: int
    padded_in_features: int


def prepare_weight(weight: torch.Tensor, scale: torch.Tensor) -> PreparedWeight:
    """Once at load: Quark's uint8 weight [N, K/2] and e8m0 scale [N, K/32] -> what gemm_a4w4 reads."""
    k = weight.shape[1] * 2
    padded_w, padded_s = pad_k(weight, scale, K_ALIGN)
    return PreparedWeight(shuffle_weight(padded_w).view(FP4X2), shuffle_scale(padded_s).view(E8M0), k,
                          padded_w.shape[1] * 2)


def mxfp4_linear(x: torch.Tensor, prepared: PreparedWeight) -> torch.Tensor:
    """y = qdq_mxfp4(x) @ W^T with W prepared by prepare_weight; x [..., K] bf16/fp16."""
    rows = x.reshape(-1, prepared.in_features)
    m, n = rows.shape[0], prepared.weight.shape[0]
    if prepared.padded_in_features != prepared.in_features:
        rows = nnf.pad(rows, (0, prepared.padded_in_features - prepared.in_features))
    x_fp4, x_scale = detect.call(F.MXFP4_QUANT, x=rows.contiguous(), scaling_mode="even", shuffle=True)
    kwargs = dict(A=x_fp4, B=prepared.weight, A_scale=x_scale, B_scale=prepared.scale, bpreshuffle=True)
    if "out" in detect.parameter_names(F.GEMM_A4W4):
        kwargs["out"] = torch.empty(round_up(m, M_ALIGN), n, dtype=x.dtype, device=x.device)
    else:
        kwargs["dtype"] = x.dtype
    y = detect.call(F.GEMM_A4W4, **kwargs)
    return y[:m].reshape(*x.shape[:-1], n)


class AiterMXFP4Linear:
    """The MXFP4 linear as the layer calls it (dispatch's mxfp4_linear): the weight re-laid out once at load,
    where the layer's own packed tensors are then dropped; gemm_a4w4 per call."""

    def prepare_weights(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    PreparedWeight]:
        prepared = prepare_weight(weight, scale)
        dropped = torch.empty(0, dtype=torch.uint8, device=weight.device)
        return dropped, dropped, prepared

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, prepared: PreparedWeight,
               quantize_x: bool, summed: bool = True) -> torch.Tensor:
        return mxfp4_linear(x, prepared)


MXFP4_LINEAR = AiterMXFP4Linear()


def _refuses(platform, shape: dict) -> str | None:
    if platform.arch not in detect.FP4_ARCHS:
        return f"MXFP4 GEMM needs gfx950 ({platform.arch} has no FP4 compute; gemm_a4w4 raises there)"
    if not shape.get("dynamic_input", True):
        return "gemm_a4w4 quantizes activations too; weight-only MXFP4 is left to Triton"
    if shape.get("n", 0) % N_ALIGN:
        return f"gemm_a4w4's weight shuffle needs out_features divisible by {N_ALIGN} (got {shape['n']})"
    return None


declare("mxfp4_linear", "aiter", MXFP4_LINEAR, refuses=_refuses, requires=(F.GEMM_A4W4, F.MXFP4_QUANT))
