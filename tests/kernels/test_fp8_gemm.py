"""The Triton FP8 GEMM (fused dynamic activation quantization, block-scaled weights) against the torch reference
(quant.fp8), under TRITON_INTERPRET=1 on CPU; on a GPU the same tests run compiled (pytest -m gpu)."""
import pytest
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.fp8.quant import round_e4m3
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec
from helpers import assert_gemm_close

# one device: the interpreter on CPU, compiled on a GPU (where Triton cannot take CPU tensors)
DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else ["cpu"]

CASES = [  # (weight strategy, activation, M, N, K)
    ("channel", "token", 5, 96, 192),
    ("channel", None, 3, 80, 160),
    ("tensor", "static", 7, 64, 128),
    ("block", "group", 4, 200, 256),    # a partial row block
    ("block", None, 2, 72, 200),        # partial row and K blocks, weight-only
    ("block", "token", 33, 130, 384),
    ("channel", "token", 70, 64, 96),   # K not a multiple of the K step
]


def _layer(strategy: str, activation: str | None, n: int, k: int, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    spec = FP8Spec(strategy, activation)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, n)[:, None]
    q, stored = fp8.quantize_weight(w, spec)
    if strategy == "block":
        scale = fp8.expand_block_scales(stored, n, k, spec.block)
    else:
        scale = stored.float().reshape(-1, 1).expand(n, 1).contiguous()
    input_scale = torch.tensor([0.05]) if activation == "static" else None
    move = (lambda t: None if t is None else t.to(device))
    return spec, move(q), move(scale), move(input_scale)


def _x(m: int, k: int, device: str, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, m)[:, None]
    x[0] = 0.0  # an all-zero token: scale eps, zeros out
    return x.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy, activation, m, n, k", CASES)
def test_fp8_gemm_matches_reference(device, strategy, activation, m, n, k):
    from atomlite.model_ops.triton.fp8.gemm import fp8_gemm
    spec, q, scale, input_scale = _layer(strategy, activation, n, k, device)
    x = _x(m, k, device)
    got = fp8_gemm(x, q, scale, input_scale, activation, spec.group_size, spec.block_k)
    # the quantized x is the reference's exactly; only the summation order and precision differ
    assert_gemm_close(got, x, q, scale, spec, input_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy, activation, n, k", [("channel", "token", 200, 400), ("block", "group", 72, 384),
                                                        ("tensor", "static", 136, 1040)])
def test_weight_tiles_by_tma_in_k_parts_match_reference(device, strategy, activation, n, k, monkeypatch):
    """W's tiles by TMA (zeros past N and K, rows starting at each tile's first) with K split into parts of one
    step each (TMA on Hopper and in the interpreter)."""
    from atomlite.model_ops.triton.fp8 import gemm, tuning
    from atomlite.model_ops.triton.common import nvidia_capability
    spec, q, scale, input_scale = _layer(strategy, activation, n, k, device)
    # more programs per SM than tiles and K steps: one K step a split
    tile = tuning.FP8TileConfig(16, 64, 128, 4, 1, split_k=True, programs_per_sm=64, min_k_steps=1, tma=True)
    for name in ("INTERPRETER", "EXACT", "DECODE", "DECODE_K_BLOCKS", "DECODE_K_BLOCKS_WIDE"):
        monkeypatch.setattr(tuning, name, tile)  # fp32 dots (the interpreter), or fp8 x's decode tiles on a GPU
    launches = []
    run_kernel = gemm.run_kernel
    monkeypatch.setattr(gemm, "run_kernel", lambda kernel, grid, *args, **kw: (
        launches.append((kernel, grid, kw.get("TMA"))), run_kernel(kernel, grid, *args, **kw))[1])
    x = _x(3, k, device)
    got = gemm.fp8_gemm(x, q, scale, input_scale, activation, spec.group_size, spec.block_k)
    assert_gemm_close(got, x, q, scale, spec, input_scale)
    (kernel, grid, tma), = launches
    assert grid[2] == -(-k // 128)
    assert tma is (device == "cpu" or nvidia_capability(q.device) >= (9, 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy, activation, m, split", [("channel", "token", 53, False),
                                                            ("block", "group", 40, False),
                                                            ("tensor", "static", 100, True),
                                                            ("channel", None, 45, True)])
def test_tiles_with_tail_rows_match_reference(device, strategy, activation, m, split, monkeypatch):
    """Tiles of 32 + 16 x rows (a second, narrower product against the same W tile): the tail's rows, the next
    tile's, and rows past M where the last tail is partial or empty, as one tile of 64 would compute them; split:
    K split over programs too (one step each), the tail's partials summed with the rest."""
    from atomlite.model_ops.triton.fp8 import gemm, tuning
    spec, q, scale, input_scale = _layer(strategy, activation, 136, 384, device)
    tile = tuning.FP8TileConfig(32, 64, 128, 4, 1, tail_m=16, split_k=split, programs_per_sm=64, min_k_steps=1)
    monkeypatch.setattr(gemm, "tile_config", lambda *args, **kwargs: tile)
    launches = []
    run_kernel = gemm.run_kernel
    monkeypatch.setattr(gemm, "run_kernel", lambda kernel, grid, *args, **kw: (
        launches.append(grid), run_kernel(kernel, grid, *args, **kw))[1])
    x = _x(m, 384, device)
    got = gemm.fp8_gemm(x, q, scale, input_scale, activation, spec.group_size, spec.block_k)
    assert_gemm_close(got, x, q, scale, spec, input_scale)
    gemm_grid = next(grid for grid in launches if len(grid) == 3)
    assert gemm_grid[1:] == (-(-m // 48), 3 if split else 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy, activation", [("channel", "token"), ("tensor", "static")])
def test_many_rows_through_torchs_scaled_mm_match_reference(device, strategy, activation):
    """Beyond tuning.library_min_rows rows of bf16 x, per-token or static x on a per-channel or per-tensor W goes to
    torch._scaled_mm with quantize_rows' e4m3 rows and scales (on CPU torch's own CPU kernel; on a GPU also through
    fp8_gemm, when its library takes row scales)."""
    from atomlite.model_ops.triton.fp8 import gemm, quant, tuning
    spec, q, scale, input_scale = _layer(strategy, activation, 96, 160, device)
    x = _x(tuning.library_min_rows(torch.device(device)) + 16, 160, device).bfloat16()
    xq, x_scale = quant.quantize_rows(x, activation, q.dtype, static_scale=input_scale)
    got = gemm.library_scaled_mm(xq, x_scale, q, scale, torch.bfloat16)
    assert_gemm_close(got, x, q, scale, spec, input_scale, torch.bfloat16)
    fits = device == "cuda" and gemm.library_takes_row_scales(x.device, q.dtype)
    assert gemm.library_fits(x, q, scale, x.dtype) == fits
    assert_gemm_close(gemm.fp8_gemm(x, q, scale, input_scale, activation), x, q, scale, spec, input_scale,
                      torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_block_scales_as_loaded_and_many_rows_through_block_scaled_mm_match_reference(device):
    """Block scales as the Triton family stores them (unit stride along N), decode rows and many: the Triton GEMM,
    or beyond LIBRARY_MIN_ROWS rows of bf16 x on a GPU whose library has 1x128 block scaling, cuBLAS's."""
    from atomlite.model_ops.triton.fp8 import gemm
    from atomlite.model_ops.triton.fp8.family import FP8_LINEAR
    spec, q, scale, _ = _layer("block", "group", 96, 256, device)
    q, scale, _ = FP8_LINEAR.prepare_weights(q, scale, spec)
    assert scale.stride(0) == 1
    for m in (3, gemm.LIBRARY_MIN_ROWS + 9):
        x = _x(m, 256, device).bfloat16()
        library = gemm.library_block_fits(x, q, scale, "group", spec.group_size, spec.block_k)
        assert library == (m > gemm.LIBRARY_MIN_ROWS and device == "cuda"
                           and gemm.library_takes_block_scales(x.device))
        got = gemm.fp8_gemm(x, q, scale, None, "group", spec.group_size, spec.block_k)
        assert_gemm_close(got, x, q, scale, spec, None, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy, activation", [("channel", "token"), ("block", "group")])
def test_unsummed_split_k_slices_add_up_to_the_summed_output(device, strategy, activation):
    """summed=False (a consumer that adds split-K slices as it reads them, model_ops.fusion): decode rows come back
    as PartialSums whose fp32 sum, rounded once, is the summed GEMM's output to the last bit of bf16 (the summing
    kernel adds the slices in a tree, a norm in slice order)."""
    from atomlite.model_ops.carriers import PartialSums, summed as add_up
    from atomlite.model_ops.triton.fp8.gemm import fp8_gemm
    spec, q, scale, input_scale = _layer(strategy, activation, 64, 2048, device)
    x = _x(2, 2048, device).to(torch.bfloat16)
    args = (x, q, scale, input_scale, activation, spec.group_size, spec.block_k)
    summed, parts = fp8_gemm(*args), fp8_gemm(*args, summed=False)
    assert isinstance(parts, PartialSums) and parts.parts.shape[0] > 1 and parts.dtype == torch.bfloat16
    torch.testing.assert_close(add_up(parts), summed, rtol=2 ** -7, atol=0)


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, round_e4m3(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


@pytest.mark.parametrize("device", DEVICES)
def test_e4m3_rounding_in_the_kernel_is_torchs(device):
    """Every e4m3 value, the midpoints between neighbours (ties to even), and values just off them."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite() & (grid >= 0)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, mids.nextafter(torch.tensor(1e9)), mids.nextafter(torch.tensor(-1e9))])
    x = torch.cat([x, -x])
    y = torch.empty_like(x, device=device)
    _round_kernel[(triton.cdiv(x.numel(), 256),)](x.to(device), y, x.numel(), BLOCK=256)
    assert torch.equal(y.cpu(), x.to(torch.float8_e4m3fn).float())


def test_fnuz_conversion_keeps_every_weight_value():
    """gfx942's e4m3fnuz: the same bits are half the value, so the scales double; fn's -0 (fnuz's NaN) is +0."""
    bits = torch.arange(256, dtype=torch.uint8)
    q = bits[(bits & 0x7F) != 0x7F].view(torch.float8_e4m3fn).reshape(2, -1)  # every finite e4m3fn value
    scale = torch.tensor([[0.5], [3.0]])
    nuz, nuz_scale = fp8.to_e4m3fnuz(q, scale)
    assert nuz.dtype == torch.float8_e4m3fnuz and not fp8.dequantize_weight(nuz, nuz_scale).isnan().any()
    assert torch.equal(fp8.dequantize_weight(nuz, nuz_scale), fp8.dequantize_weight(q, scale))


@pytest.mark.gpu
def test_fnuz_weights_give_the_checkpoints_results():
    """On an e4m3fnuz GPU (gfx942) the kernel quantizes x on fnuz's grid: the e4m3fn checkpoint's numbers."""
    from atomlite.model_ops.platform import detect_platform
    from atomlite.model_ops.triton.fp8.gemm import fp8_gemm
    if detect_platform(torch.device("cuda")).fp8_dtype != torch.float8_e4m3fnuz:
        pytest.skip("not an e4m3fnuz GPU (gfx942)")
    spec, q, scale, _ = _layer("channel", "token", 64, 128, "cpu")
    nuz, nuz_scale = fp8.to_e4m3fnuz(q, scale)
    x = _x(6, 128, "cpu")
    got = fp8_gemm(x.cuda(), nuz.cuda(), nuz_scale.cuda(), None, "token")
    assert_gemm_close(got, x, q, scale, spec, None)


def test_per_tensor_activation_scales_are_not_per_token():
    """The kernel's per-token scales differ from one scale for the whole batch (the mistake the parity tests
    must catch): rows far below the batch's largest lose precision under a per-tensor scale."""
    from atomlite.model_ops.triton.fp8.gemm import fp8_gemm
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec, q, scale, _ = _layer("channel", "token", 64, 128, device)
    x = _x(6, 128, device)
    per_tensor = torch.full((1,), x.abs().max().item() / fp8.E4M3_MAX, device=device)
    got = fp8_gemm(x, q, scale, None, "token")
    wrong = fp8_gemm(x, q, scale, per_tensor, "static")
    assert not torch.allclose(got[1], wrong[1], rtol=1e-2)


def test_decode_batches_take_the_fewest_row_tiles_that_keep_the_gpu_busy():
    """NVIDIA, 65-512 rows: one tile of x rows where W's tiles alone fill most of the GPU (W streams once); else up
    to 160 rows one tile with K split, beyond that up to three tiles of rows, so that a short N still spreads; K
    blocks of 128 for block-scaled layers."""
    from atomlite.model_ops.triton.fp8.tuning import row_tiles, rows_per_tile
    sms, ms = 132, (65, 128, 160, 161, 256, 512)
    filling = [row_tiles(m, 43008, sms, False) for m in ms]
    assert [rows_per_tile(c) for c in filling] == [128, 128, 160, 256, 256, 256]
    assert not any(c.split_k for c in filling)
    short_n = [row_tiles(m, 5376, sms, False) for m in ms]
    assert [rows_per_tile(c) for c in short_n] == [128, 128, 160, 64, 128, 256]
    assert [c.split_k for c in short_n] == [True] * 3 + [False] * 3
    assert row_tiles(100, 5376, sms, True).block_k == 128


def test_block_scaled_decode_takes_wide_tiles_only_where_narrow_ones_overfill_the_gpu():
    """Block-scaled decode: 64-row tiles, or 128-row ones by TMA where W has more 64-row tiles than the GPU holds
    programs (31B's gate_up: 672 against 4 x 132)."""
    from atomlite.model_ops.triton.fp8.tuning import DECODE_K_BLOCKS, DECODE_K_BLOCKS_WIDE, decode_k_blocks
    assert decode_k_blocks(43008, 132) is DECODE_K_BLOCKS_WIDE and DECODE_K_BLOCKS_WIDE.tma
    assert all(decode_k_blocks(n, 132) is DECODE_K_BLOCKS for n in (5376, 16384, 18432, 33792))


@pytest.mark.gpu
@pytest.mark.parametrize("strategy, activation", [("channel", "token"), ("block", "group"), ("tensor", "static"),
                                                  ("channel", None), ("block", "token")])
@pytest.mark.parametrize("m, n", [(1, 384), (5, 384), (16, 384), (40, 384), (64, 384), (100, 384), (150, 384),
                                  (300, 384), (100, 20480), (150, 20480), (200, 20480), (512, 384), (1, 40960),
                                  (16, 40960)])
def test_fp8_gemm_tile_paths_in_bf16(strategy, activation, m, n):
    """The GPU's tile paths (split-K decode, its wide block-scaled tiles, medium, the row tiles of decode batches
    with and without a tail of rows, library) on a bf16 model: the reference on the same bf16 x, within the output's
    bf16 rounding and the fp32 summation order."""
    from atomlite.model_ops.triton.fp8.gemm import fp8_gemm
    k = 2048  # a long K: the decode path splits K where N has few tiles
    spec, q, scale, input_scale = _layer(strategy, activation, n, k, "cuda")
    x = _x(m, k, "cuda").to(torch.bfloat16)
    got = fp8_gemm(x, q, scale, input_scale, activation, spec.group_size, spec.block_k)
    assert_gemm_close(got, x, q, scale, spec, input_scale, torch.bfloat16)


def _read_rows(quant, whole_row, monkeypatch) -> None:
    """How quantize_rows reads a row: whole (True), in chunks of 64 columns (groups: 128 a program) over several
    programs (False), one program a row looping 64 columns at a time ("looped", a prefill's many wide rows), or per
    token from the amaxes of chunks of 64 columns written by a launch before ("split", a decode batch's many rows).
    """
    if whole_row == "split":
        monkeypatch.setattr(quant, "SPLIT_AMAX_BLOCK", 64)
        monkeypatch.setattr(quant, "SPLIT_AMAX_WIDE", 1)
    elif whole_row == "looped":
        monkeypatch.setattr(quant, "LOOPED_BLOCK", 64)
        monkeypatch.setattr(quant, "loops_over_rows", lambda rows, k: True)
    elif not whole_row:
        monkeypatch.setattr(quant, "ROW_BLOCK", 64)
        monkeypatch.setattr(quant, "GROUP_STEP", 128)


@pytest.mark.parametrize("activation", ["token", "static", "group"])
@pytest.mark.parametrize("whole_row", [True, False, "looped", "split"])
def test_quantize_rows_is_the_references_quantization(activation, whole_row, monkeypatch):
    """The quantization pass before the GEMM, a row one program's (whole, or looped 64 columns at a time) or spread
    over programs (chunks of ROW_BLOCK, each reading the whole row for its amax; in groups, one group a program, or
    all three groups of 128 and a fourth past
    K in one): the reference's e4m3 values times their scales, exactly; MoE rows repeated per slot with each its own
    static scale."""
    from atomlite.model_ops.triton.fp8 import quant
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _read_rows(quant, whole_row, monkeypatch)
    x = _x(5, 300, device)
    x[2, -1] = 4 * x[2].abs().max()  # a row's peak in its last, partial block
    scales = torch.tensor([0.03, 0.5], device=device)
    per_pair = scales.repeat(x.shape[0])  # token t's slot j: scales[j]
    for static, repeat in ((scales[:1], 1), (per_pair, 2)) if activation == "static" else ((None, 1),):
        q, s = quant.quantize_rows(x, activation, torch.float8_e4m3fn, static_scale=static, rows_per_source=repeat)
        rows = x.repeat_interleave(repeat, 0).cpu()
        spec = FP8Spec("channel", activation)
        per_row = static.cpu().expand(rows.shape[0]) if static is not None else [None] * rows.shape[0]
        want = torch.stack([fp8.quantize_dequantize_input(r[None], spec, t)[0] for r, t in zip(rows, per_row)])
        got = q.float().cpu() * fp8._per_element(s.cpu(), x.shape[1], spec.group_size)
        assert torch.equal(got, want)


@pytest.mark.parametrize("activation", ["token", "static", "group"])
@pytest.mark.parametrize("whole_row", [True, False, "looped", "split"])
def test_gated_quantization_quantizes_what_the_activation_kernel_writes(activation, whole_row, monkeypatch):
    """quantize_rows of [gate | up] (gated, the down projection's GatedInput) gives the bits and scales of the
    activation kernel's bf16 gelu_tanh(gate) * up quantized: one launch where there were two."""
    from atomlite.model_ops.triton.activation import gelu_tanh_and_mul
    from atomlite.model_ops.triton.fp8 import quant
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _read_rows(quant, whole_row, monkeypatch)
    gate_up = _x(5, 600, device).to(torch.bfloat16)
    static = torch.tensor([0.03], device=device) if activation == "static" else None
    q, s = quant.quantize_rows(gate_up, activation, torch.float8_e4m3fn, static_scale=static, gated=True)
    want_q, want_s = quant.quantize_rows(gelu_tanh_and_mul(gate_up), activation, torch.float8_e4m3fn,
                                         static_scale=static)
    assert q.shape == (5, 300) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s, want_s)


def test_a_few_rows_split_their_amax_only_where_they_are_very_wide():
    """Per token, up to 16 rows from SPLIT_AMAX_WIDE columns (31B's o and down inputs) and any rows from
    SPLIT_AMAX_VERY_WIDE (31B's down input) split their amax; 26B-A4B's 4096 and 2112, and the hidden widths, keep
    their chunks: 31B's gated down input is then quantized from [gate | up], without the activation kernel."""
    from atomlite.model_ops.triton.fp8.quant import quantizes_gated_cheaply, splits_amax
    assert splits_amax(1, 8192, "token") and splits_amax(16, 8192, "token") and splits_amax(4, 21504, "token")
    assert splits_amax(512, 21504, "token") and splits_amax(2048, 21504, "token")
    assert not splits_amax(17, 8192, "token") and not splits_amax(17, 5376, "token")
    assert not splits_amax(1, 4096, "token") and not splits_amax(4, 2112, "token")
    assert not splits_amax(1, 21504, "static")
    assert quantizes_gated_cheaply(1, 21504, "token", torch.device("cpu"))


def test_per_token_gated_rows_up_to_4096_wide_are_quantized_from_gate_and_up():
    """Per token, a decode row up to GATED_WHOLE_ROW_MAX_K wide (26B-A4B's dense down input, 2112) is quantized from
    [gate | up] though its programs each compute the whole row's amax; wider rows in chunks without a split amax take
    the activation kernel first. (num_sms is 132 off the GPU too, so the chunks are those of an H100/H200.)"""
    from atomlite.model_ops.triton.fp8.quant import GATED_WHOLE_ROW_MAX_K, quantizes_gated_cheaply, row_chunk
    cpu = torch.device("cpu")
    for rows, k in [(1, 2112), (8, 2112), (32, GATED_WHOLE_ROW_MAX_K)]:
        assert row_chunk(rows, k, cpu) < k and quantizes_gated_cheaply(rows, k, "token", cpu)
    for rows, k in [(1, 5000), (32, GATED_WHOLE_ROW_MAX_K + 1), (64, 5376)]:
        assert row_chunk(rows, k, cpu) < k and not quantizes_gated_cheaply(rows, k, "token", cpu)


def test_many_rows_loop_over_wide_rows_unless_a_power_of_two_fills_the_block():
    """A prefill's rows from LOOPED_MIN_K columns are read LOOPED_BLOCK at a time, unless their width is a power of
    two (31B's o input, 8192): those stay whole, as do fewer rows and narrower ones (per token, very wide rows split
    their amax first: splits_amax)."""
    from atomlite.model_ops.triton.fp8.quant import LOOPED_MIN_K, LOOPED_MIN_ROWS, loops_over_rows
    assert loops_over_rows(LOOPED_MIN_ROWS, 5376) and loops_over_rows(2048, 21504)
    assert not loops_over_rows(2048, 8192) and not loops_over_rows(2048, LOOPED_MIN_K)
    assert not loops_over_rows(LOOPED_MIN_ROWS - 1, 5376) and not loops_over_rows(2048, 2816)


def test_the_cast_alone_rounds_only_where_the_gpu_casts_half_to_even(monkeypatch):
    """NVIDIA sm_89+ casts fp32 to e4m3fn half to even itself (cvt.rn.satfinite), so the quantization skips its own
    rounding there; elsewhere, and in the interpreter, the rounding stays (the GPU tests above compare the bits)."""
    from atomlite.model_ops.platform import Platform
    from atomlite.model_ops.triton import common
    device = torch.device("cuda")
    rounds = {}
    for platform in (Platform("cuda", "sm_90"), Platform("cuda", "sm_89"), Platform("cuda", "sm_80"),
                     Platform("rocm", "gfx950"), Platform("cpu")):
        monkeypatch.setattr(common, "platform_of", lambda _device, p=platform: p)
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        rounds[platform.arch or platform.kind] = common.fp8_cast_rounds(device)
    assert rounds == {"sm_90": True, "sm_89": True, "sm_80": False, "gfx950": False, "cpu": False}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(common, "platform_of", lambda _device: Platform("cuda", "sm_90"))
    assert not common.fp8_cast_rounds(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["token", "group"])
def test_dynamic_scales_divide_every_bf16_value_as_torch_does(device, activation):
    """Scales from the values' own amax divide through their reciprocal on a GPU (quant.divided_by): every bf16
    value whose quotient is at least 2^-12 (e4m3's subnormal steps included), either sign, under row maxima with
    each of the 128 bf16 significands (so every scale a bf16 row can have, but for its exponent) and tiny ones
    (their scales lifted by 2^64 first), quantizes per token and per group of 128 as torch's division does, with
    the same scales. In the interpreter the division is div_rn's: the test runs the reciprocal on a GPU."""
    from atomlite.model_ops.triton.fp8 import quant
    positive = torch.arange(0x0080, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    significands = [((100 + m % 60) << 7) | m for m in range(128)]  # exponents 2^-27 .. 2^32
    amaxes = torch.tensor(significands, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    amaxes = torch.cat([amaxes, torch.tensor([1e-25, 3e-30, 2e-36]).to(torch.bfloat16).float()])
    rows = []
    for amax in amaxes:
        values = positive[(positive >= amax * 2.0 ** -21) & (positive <= amax)]
        rows.append(torch.cat([values, -values]))
    width = max(len(r) for r in rows)
    x = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    q, s = quant.quantize_rows(x.to(device), activation, torch.float8_e4m3fn)
    spec = FP8Spec("channel", activation)
    want = fp8.quantize_dequantize_input(x, spec)
    assert torch.equal(q.float().cpu() * fp8._per_element(s.cpu(), width, spec.group_size), want)


@pytest.mark.parametrize("device", DEVICES)
def test_quotients_next_to_e4m3_midpoints_round_as_torch_divides(device):
    """Per token, values whose quotient by the row's scale lies within a few fp32 steps of a point halfway between
    two e4m3 values, where a quotient one step off rounds the other way: torch's division's e4m3 values, under 256
    random row maxima (the reciprocal's correction is what gets these right; quant.divided_by)."""
    from atomlite.model_ops.triton.fp8 import quant
    grid = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    midpoints = (grid[:-1] + grid[1:]) / 2
    gen = torch.Generator().manual_seed(1)
    amaxes = torch.rand(256, generator=gen, dtype=torch.float64).mul(40).sub(20).exp2().float()
    scales = amaxes / 448
    near = (midpoints[None, :] * scales[:, None])[..., None].expand(-1, -1, 7).contiguous()
    steps = torch.arange(-3, 4, dtype=torch.int32)
    near = (near.view(torch.int32) + steps).view(torch.float32).flatten(1)
    x = torch.cat([amaxes[:, None], near, -near], dim=1)
    q, s = quant.quantize_rows(x.to(device), "token", torch.float8_e4m3fn)
    assert torch.equal(s.cpu()[:, 0], scales)
    assert torch.equal(q.float().cpu(), fp8.round_e4m3(x / scales[:, None]))


@pytest.mark.parametrize("device", DEVICES)
def test_values_halfway_between_e4m3_steps_round_to_even(device):
    """Every value halfway between two neighbouring e4m3fn values (subnormal steps included), either sign, and the
    grid itself, quantized with a static scale of 1: the bits torch's cast gives, half to even, on the quantization's
    own rounding (the interpreter, ROCm) and on the cast's alone (NVIDIA sm_89+, common.fp8_cast_rounds). Compared
    as values: what rounds to zero keeps its sign in the cast, not in the quantization's rounding."""
    from atomlite.model_ops.triton.fp8 import quant
    grid = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    halfway = (grid[:-1] + grid[1:]) / 2
    x = torch.cat([grid, halfway, -grid, -halfway])[None].to(device)
    q, _ = quant.quantize_rows(x, "static", torch.float8_e4m3fn, static_scale=torch.ones(1, device=device))
    assert torch.equal(q.float().cpu(), x.cpu().to(torch.float8_e4m3fn).float())
