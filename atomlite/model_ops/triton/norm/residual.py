"""The residual update around a sublayer in one pass: summed = (residual + rms_norm(x) * w) [* scale], and
optionally the next norm of it, rms_norm(summed) * w_next. Each step rounds to the activation dtype where the
separate ops would, so the result equals theirs. x may be a split-K GEMM's PartialSums (the kernel adds its K
slices as it reads the row), or a NormedPair: two branches' output norms summed, each side plain or PartialSums; and
under tensor parallelism x (or both sides) may be RankPartials, this rank's share (a tensor, or PartialSums whose
slices are added first), which the program exchanges with the other ranks through peer memory and sums first.
The next norm's output may be written quantized for the GEMM that reads it, MXFP4's fp8 blocks (QuantizedRows) or
FP8 per token (TokenRows): that GEMM's quantization launch is saved. One program per row; on sm_90 a dependent
launch (it waits for the kernel before, which may let it start early).
"""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.carriers import (InputQuantization, NormedPair, PartialSums, QuantizedRows, RankPartials,
                                         TokenQuantization, TokenRows)
from atomlite.model_ops.triton.all_reduce import peer_rows_sum
from atomlite.model_ops.triton.common import (dependent_launches, fp8_cast_rounds, gdc_launch_dependents, gdc_wait,
                                              interpreting, nvidia_capability, pdl_launch, run_kernel)
from atomlite.model_ops.triton.fp8.quant import amax_scale, quantize_fp8
from atomlite.model_ops.triton.mxfp4.fp8_tiles import store_quantized
from atomlite.model_ops.triton.norm.tuning import (MAX_WARPS, RESIDUAL_VALUES_PER_WARP, TOKEN_ROWS_FEW_ROWS,
                                                   TOKEN_ROWS_MAX_WARPS)
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.triton.norm import tuning
from atomlite.model_ops.triton.norm.rms_norm import refuses_dim


@triton.jit
def load_row(x, offsets, mask, stride_part, PARTS: tl.constexpr, dtype: tl.constexpr):
    """A row of x in fp32; with PARTS > 1 the sum of PARTS fp32 rows stride_part apart (a PartialSums' slices,
    added in slice order), rounded to dtype."""
    row = tl.load(x + offsets, mask=mask, other=0.0).to(tl.float32)
    if PARTS > 1:
        for part in tl.static_range(1, PARTS):
            row += tl.load(x + part * stride_part + offsets, mask=mask, other=0.0)
        row = row.to(dtype).to(tl.float32)
    return row


@triton.jit
def _normed(xf, w, dim, eps, dtype: tl.constexpr):
    """rms_norm(x) * w of a row in fp32 (w: the weight row, loaded), rounded to dtype."""
    y = xf * tl.math.rsqrt(tl.sum(xf * xf, 0) / dim + eps)
    return (y * w).to(dtype).to(tl.float32)


@triton.jit
def _weight_row(weight, cols, mask):
    return tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_token_row(q_row, scale_at, o, cols, mask, FNUZ: tl.constexpr, CAST_ROUNDS: tl.constexpr,
                     RECIPROCAL: tl.constexpr):
    """A norm's row o (rounded to the activation dtype) quantized per token into q_row, its scale at scale_at, as
    fp8.quant.quantize_rows writes them."""
    of = o.to(tl.float32)
    token_scale = amax_scale(of)
    tl.store(q_row + cols, quantize_fp8(of, token_scale, FNUZ, q_row.dtype.element_ty, CAST_ROUNDS, RECIPROCAL),
             mask=mask)
    tl.store(scale_at, token_scale * (2.0 if FNUZ else 1.0))


@triton.jit
def _norm_residual_kernel(x, residual, weight, scale, next_weight, summed, out, xq, x_scale, weight_1, out_1,
                          weight_2, out_2, last_scale, x_b, weight_a, weight_b, peer_buffers, peer_epochs, dim, eps,
                          stride_x, stride_r, stride_part, stride_xb, stride_part_b, stride_qm, stride_sm, K_PADDED,
                          slot_words, HAS_SCALE: tl.constexpr, HAS_NEXT: tl.constexpr, PARTS: tl.constexpr,
                          PDL: tl.constexpr, PERIOD: tl.constexpr, MORE_NORMS: tl.constexpr, PAIR: tl.constexpr,
                          PARTS_B: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK_D: tl.constexpr,
                          TOKEN: tl.constexpr = False, FNUZ: tl.constexpr = False, CAST_ROUNDS: tl.constexpr = False,
                          RECIPROCAL: tl.constexpr = False, TOKEN_LAST: tl.constexpr = False):
    """PERIOD > 0: the next norm's output goes to xq / x_scale, quantized as mxfp4_gemm_fp8 reads it, not to out;
    TOKEN: quantized per token as fp8.quant.quantize_rows writes it (FNUZ: e4m3fnuz; CAST_ROUNDS, RECIPROCAL:
    quantize_fp8's).
    MORE_NORMS (0-2): norms of the sum under weight_1 (and weight_2) too, into out_1 (and out_2); TOKEN_LAST: the
    last of them quantized per token so, its scales at last_scale. PAIR: the input
    row is rms_norm(x) * weight_a + rms_norm(x_b) * weight_b. WORLD > 1: x (and x_b) are this rank's shares, summed
    over the ranks through peer memory first (RankPartials). The weights (no kernel writes them) load before a
    dependent launch waits: at decode they come from memory, while the kernel ahead finishes."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < dim
    dtype = summed.dtype.element_ty
    if PDL:
        # the kernel after (a GEMM) may start: it reads its first weights, then waits for this grid
        gdc_launch_dependents()
    w = _weight_row(weight, cols, mask)
    w_a = w
    w_b = w
    if PAIR:
        w_a = _weight_row(weight_a, cols, mask)
        w_b = _weight_row(weight_b, cols, mask)
    w_next = w
    w_1 = w
    w_2 = w
    if HAS_NEXT:
        w_next = _weight_row(next_weight, cols, mask)
        if MORE_NORMS > 0:
            w_1 = _weight_row(weight_1, cols, mask)
        if MORE_NORMS > 1:
            w_2 = _weight_row(weight_2, cols, mask)
    if PDL:
        gdc_wait()  # for the kernel before, which wrote x
    xf = load_row(x, row * stride_x + cols, mask, stride_part, PARTS, dtype)
    xf_b = xf
    if PAIR:
        xf_b = load_row(x_b, row * stride_xb + cols, mask, stride_part_b, PARTS_B, dtype)
    if WORLD > 1:
        xf, xf_b = peer_rows_sum(xf, xf_b, cols, mask, row, dim, peer_buffers, peer_epochs, slot_words, RANK,
                                 WORLD, PAIR, dtype)
    if PAIR:
        xf = _normed(xf, w_a, dim, eps, dtype) + _normed(xf_b, w_b, dim, eps, dtype)
        xf = xf.to(dtype).to(tl.float32)
    y = _normed(xf, w, dim, eps, dtype)
    total = (tl.load(residual + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32) + y).to(dtype)
    if HAS_SCALE:
        total = (total.to(tl.float32) * tl.load(scale).to(tl.float32)).to(dtype)
    tl.store(summed + row * dim + cols, total, mask=mask)
    if HAS_NEXT:
        tf = total.to(tl.float32)
        normed = tf * tl.math.rsqrt(tl.sum(tf * tf, 0) / dim + eps)
        for i in tl.static_range(MORE_NORMS):
            w_i, out_i = (w_1, out_1) if i == 0 else (w_2, out_2)
            o_i = (normed * w_i).to(dtype)
            if TOKEN_LAST and i == MORE_NORMS - 1:
                _store_token_row(out_i + row * dim, last_scale + row, o_i, cols, mask, FNUZ, CAST_ROUNDS, RECIPROCAL)
            else:
                tl.store(out_i + row * dim + cols, o_i, mask=mask)
        o = (normed * w_next).to(dtype)
        if PERIOD > 0:
            store_quantized(xq, x_scale, tl.reshape(o.to(tl.float32), (1, BLOCK_D)), row + tl.arange(0, 1), 0, row + 1,
                            K_PADDED, stride_qm, stride_sm, PERIOD, 1, BLOCK_D)
        elif TOKEN:
            _store_token_row(xq + row * stride_qm, x_scale + row * stride_sm, o, cols, mask, FNUZ, CAST_ROUNDS,
                             RECIPROCAL)
        else:
            tl.store(out + row * dim + cols, o, mask=mask)


def _rows(t: torch.Tensor | PartialSums | RankPartials) -> tuple[torch.Tensor, int, int]:
    """t as [rows, dim] with unit stride along dim (the kernels take one row stride), the stride between its K
    slices and their count (a PartialSums: its first slice; a tensor: one slice; RankPartials: this rank's share)."""
    if isinstance(t, RankPartials):
        t = t.part
    if isinstance(t, PartialSums):
        return t.parts[0], t.parts.stride(0), t.parts.shape[0]
    rows = t.reshape(-1, t.shape[-1])
    return (rows if rows.stride(-1) == 1 else rows.contiguous()), 0, 1


def _peer_channel(x, pair: bool, rows: int, dim: int, element_size: int):
    """The PeerChannel through which x's rows are summed over the ranks (RankPartials; a NormedPair's sides both),
    or None."""
    sides = (x.a, x.b) if pair else (x,)
    shared = [isinstance(side, RankPartials) for side in sides]
    if not any(shared):
        return None
    if not all(shared):
        raise ValueError("a NormedPair's sides are RankPartials together or not at all")
    channel = sides[0].channel
    if not channel.holds(rows, dim, element_size):
        raise ValueError(f"{rows} rows of {dim} exceed what one exchange through peer memory holds")
    return channel


def _launch_options(device: torch.device) -> tuple[bool, dict]:
    """The PDL flag and launch options: a dependent launch where griddepcontrol exists (NVIDIA sm_90+)."""
    pdl = dependent_launches(device)
    return pdl, pdl_launch(pdl)


def _warps(block_d: int, rows: int, token: bool, device: torch.device) -> int:
    few_token_rows = token and rows <= TOKEN_ROWS_FEW_ROWS and nvidia_capability(device) > (0, 0)
    return min(TOKEN_ROWS_MAX_WARPS if few_token_rows else MAX_WARPS, max(1, block_d // RESIDUAL_VALUES_PER_WARP))


def rms_norm_residual(x: torch.Tensor | PartialSums | NormedPair, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float,
                      scale: torch.Tensor | None = None,
                      next_weight: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
                      quantize: InputQuantization | TokenQuantization | None = None,
                      quantize_last: TokenQuantization | None = None):
    """Same contract as torch_ref.rms_norm_residual (up to 3 next weights); with quantize the (first) next norm's
    output comes back as QuantizedRows in that form, or TokenRows (2-D residual); with quantize_last the last of two
    or three next norms' as TokenRows (a MoE layer's experts' input)."""
    dim = residual.shape[-1]
    weights = next_weight if isinstance(next_weight, tuple) else () if next_weight is None else (next_weight,)
    if len(weights) > 3:
        raise ValueError(f"rms_norm_residual takes up to 3 next weights, got {len(weights)}")
    if quantize_last is not None and len(weights) < 2:
        raise ValueError(f"quantize_last quantizes the last of two or three next norms, not of {len(weights)}")
    pair = isinstance(x, NormedPair)
    (rows_x, stride_part, parts), (rows_r, _, _) = _rows(x.a if pair else x), _rows(residual)
    rows_b, stride_part_b, parts_b = _rows(x.b) if pair else (rows_x, 0, 1)
    weight_a, weight_b = (x.weight_a, x.weight_b) if pair else (weight, weight)
    rows = rows_r.shape[0]
    summed = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    outs = [torch.empty_like(summed) for _ in weights]
    values, scales, k_padded, period = summed, summed, dim, 0
    token = isinstance(quantize, TokenQuantization) and bool(weights)
    if token:
        outs[0] = TokenRows.empty(rows, dim, quantize, residual.dtype, residual.device)
        values, scales = outs[0].values, outs[0].scales
    elif quantize is not None and weights:
        outs[0] = QuantizedRows.empty(rows, quantize, residual.dtype, residual.device)
        values, scales, k_padded, period = outs[0].values, outs[0].scales, quantize.k_padded, quantize.period
    if quantize_last is not None:
        outs[-1] = TokenRows.empty(rows, dim, quantize_last, residual.dtype, residual.device)
    fnuz = any(isinstance(form, TokenQuantization) and form.fp8_dtype == torch.float8_e4m3fnuz
               for form in (quantize, quantize_last))
    quantizes = token or quantize_last is not None
    channel = _peer_channel(x, pair, rows, dim, residual.element_size())
    peer = (channel.buffers, channel.epochs) if channel is not None else (weight,) * 2
    if rows:
        block_d = triton.next_power_of_2(max(dim, k_padded))
        pdl, options = _launch_options(residual.device)
        tensors = [out if isinstance(out, torch.Tensor) else summed for out in outs] + [summed] * (3 - len(outs))
        if quantize_last is not None:
            tensors[len(outs) - 1] = outs[-1].values
        more = list(weights[1:]) + [weight] * (3 - len(weights))
        run_kernel(_norm_residual_kernel, (rows,), rows_x, rows_r, weight,
                   scale if scale is not None else weight, weights[0] if weights else weight, summed, tensors[0],
                   values, scales, more[0], tensors[1], more[1], tensors[2],
                   outs[-1].scales if quantize_last is not None else summed, rows_b, weight_a, weight_b, *peer, dim,
                   eps, rows_x.stride(0), rows_r.stride(0), stride_part, rows_b.stride(0), stride_part_b,
                   values.stride(0), scales.stride(0), k_padded,
                   channel.slot_words(residual.dtype) if channel is not None else 0, HAS_SCALE=scale is not None,
                   HAS_NEXT=bool(weights), PARTS=parts, PDL=pdl, PERIOD=period, MORE_NORMS=max(0, len(weights) - 1),
                   PAIR=pair, PARTS_B=parts_b, RANK=channel.rank if channel is not None else 0,
                   WORLD=channel.world if channel is not None else 1, BLOCK_D=block_d,
                   TOKEN=token, FNUZ=fnuz, CAST_ROUNDS=quantizes and fp8_cast_rounds(residual.device),
                   RECIPROCAL=quantizes and not interpreting(), TOKEN_LAST=quantize_last is not None,
                   num_warps=_warps(block_d, rows, token, residual.device), **options)
    if isinstance(next_weight, tuple):
        return summed, tuple(outs)
    return summed, outs[0] if outs else None


declare("rms_norm_residual", "triton", rms_norm_residual, refuses=refuses_dim, tuning=tuning,
        capabilities={"reads_partial_sums", "reads_normed_pair", "writes_quantized_rows", "writes_token_rows",
                      "reads_rank_partials"})
