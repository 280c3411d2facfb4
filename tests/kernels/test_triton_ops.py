"""Triton KV write, RMSNorm (+ residual add), RoPE and gelu_tanh_and_mul equal their torch_ref functions."""
import pytest
import torch

from atomlite.model_ops import kernels, torch_ref
from atomlite.model_ops import triton as tri
from atomlite.model_ops.carriers import NormedPair, summed as summed_up
from atomlite.model_ops.platform import Platform

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def assert_matches(out, ref_fp32):
    """fp32: rounding-level; bf16: one rounding of the fp32 result, so within one bf16 ulp."""
    assert out.shape == ref_fp32.shape and not out.isnan().any()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref_fp32, atol=1e-5, rtol=1e-5)
    else:
        err = (out.float() - ref_fp32).abs()
        assert (err <= ref_fp32.abs() * 2.0 ** -7 * 1.01 + 1e-5).all(), err.max()


@pytest.fixture(autouse=True)
def seeded():
    """Each test's data the same whichever tests ran before it in the process (bf16 tolerances are checked on it)."""
    torch.manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(2, 64, 16), (1, 512, 32), (3, 80, 16)])
def test_write_kv_matches_reference_and_skips_negative_slots(dtype, num_kv_heads, head_dim, block_size):
    num_blocks, num_tokens = 6, 13
    k, v = randn(num_tokens, num_kv_heads, head_dim, dtype=dtype), randn(num_tokens, num_kv_heads, head_dim,
                                                                         dtype=dtype)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[[2, 7]] = -1
    caches = [torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype,
                         device=DEVICE) for _ in range(4)]
    torch_ref.write_kv(k, v, caches[0], caches[1], slots)
    tri.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[2].isnan(), caches[0].isnan())
    assert torch.equal(caches[2].nan_to_num(), caches[0].nan_to_num())
    assert torch.equal(caches[3].nan_to_num(), caches[1].nan_to_num())


def test_write_kv_reads_strided_views():
    kv = randn(5, 2, 2, 64)  # a fused projection: k and v are views with a token stride of 256
    caches = [torch.zeros(4, 16, 2, 64, device=DEVICE) for _ in range(4)]
    slots = torch.tensor([3, -1, 17, 40, 63], device=DEVICE)
    torch_ref.write_kv(kv[:, 0], kv[:, 1], caches[0], caches[1], slots)
    tri.write_kv(kv[:, 0], kv[:, 1], caches[2], caches[3], slots)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,with_weight", [((7, 5376), True), ((9, 3, 256), False), ((4, 2, 512), True),
                                               ((5, 100), True)])
def test_rms_norm_matches_reference(dtype, shape, with_weight):
    x = randn(*shape, dtype=dtype) * 3
    weight = randn(shape[-1], dtype=dtype) if with_weight else None
    ref = torch_ref.rms_norm(x.float(), weight.float() if with_weight else None, 1e-6)
    assert_matches(tri.rms_norm(x, weight, 1e-6), ref)


def test_rms_norm_on_head_view_of_fused_projection():
    qkv = randn(6, 4 + 2 + 2, 128)
    q = qkv[:, :4]
    weight = randn(128)
    assert_matches(tri.rms_norm(q, weight, 1e-6), torch_ref.rms_norm(q, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 2 * 2112), (3, 2, 2 * 96)])
def test_gelu_tanh_and_mul_matches_reference(dtype, shape):
    x = randn(*shape, dtype=dtype) * 3
    assert_matches(tri.gelu_tanh_and_mul(x), torch_ref.gelu_tanh_and_mul(x.float()))


def test_empty_inputs_give_empty_outputs():
    assert tri.rms_norm(randn(0, 64), None, 1e-6).shape == (0, 64)
    assert tri.gelu_tanh_and_mul(randn(0, 128)).shape == (0, 64)


@pytest.mark.parametrize("op,shape,refused", [
    ("attention", dict(head_dim=512, window=False, gqa=8), False),
    ("attention", dict(head_dim=576, window=False, gqa=8), True),
    ("attention", dict(head_dim=1024, window=True, gqa=2), True),
    ("attention", dict(head_dim=256, window=True, gqa=128), True),
    ("qk_norm_rope", dict(head_dim=63), True),
    ("rms_norm", dict(dim=5376), False),
    ("axial_qkv_norm_rope", dict(head_dim=72), False),
    ("axial_qkv_norm_rope", dict(head_dim=70), True),
])
def test_limits_refuse_shapes_the_kernels_cannot_do(op, shape, refused):
    reason = kernels.refusal("triton", op, Platform("cuda", "sm_90"), shape)
    assert (reason is not None) == refused
    assert kernels.kernel("triton", op) is not None


def assert_prepared(out, ref_fp32):
    """bf16 rounds after the norm and again after RoPE (as the separate kernels do, truncating in the
    interpreter): within a few ulps of each head row's largest value."""
    if out.dtype == torch.float32:
        return assert_matches(out, ref_fp32)
    err = (out.float() - ref_fp32).abs()
    assert (err <= 2.0 ** -5 * ref_fp32.abs().amax(-1, keepdim=True) + 1e-5).all(), err.max()


def _rotation(tokens: int, head_dim: int, dtype):
    angles = torch.rand(tokens, head_dim // 2, device=DEVICE) * 6
    return (torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,tokens", [(4, 2, 64, 5), (2, 1, 512, 5), (3, 3, 80, 5),
                                                                   (2, 1, 64, 70)])
def test_qk_norm_rope_writes_the_cache_like_the_separate_ops(dtype, num_heads, num_kv_heads, head_dim, tokens):
    """Views of one fused projection in; q out, k and v straight into the cache (slot -1 skipped). 70 tokens:
    several a program, the last program's partly past the end."""
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
    q, k, v = (t.view(tokens, -1, head_dim) for t in qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1))
    q_w, k_w = (randn(head_dim, dtype=dtype) + 1.0 for _ in range(2))
    cos, sin = _rotation(tokens, head_dim, dtype)
    slots = torch.tensor([3, -1, 7, 0, 12] + list(range(13, 13 + tokens - 5)), device=DEVICE)
    blocks = -(-(8 + tokens) // 4)
    caches = [torch.full((blocks, 4, num_kv_heads, head_dim), 7.0, device=DEVICE, dtype=dtype) for _ in range(4)]
    out_q, none_k, none_v = tri.qk_norm_rope(q, k, v, q_w, k_w, 1e-6, cos, sin, caches[0], caches[1], slots)
    f32 = [t.float() for t in (q, k, v, q_w, k_w, cos, sin)]
    ref_q, ref_k, ref_v = torch_ref.qk_norm_rope(*f32[:5], 1e-6, *f32[5:])
    assert none_k is None and none_v is None
    assert_prepared(out_q, ref_q)
    torch_ref.write_kv(ref_k, ref_v, caches[2], caches[3], slots)  # untouched slots keep their 7.0
    assert_prepared(caches[0], caches[2].float())
    assert_prepared(caches[1], caches[3].float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_without_v_norm_stores_v_as_projected(dtype):
    """v_norm=False (attention that norms q and k alone): the cache's V rows are v itself, K and q as with the norm."""
    tokens, heads, kv_heads, head_dim = 5, 4, 2, 64
    q, k, v = (randn(tokens, h, head_dim, dtype=dtype) * 3 for h in (heads, kv_heads, kv_heads))
    q_w, k_w = (randn(head_dim, dtype=dtype) + 1.0 for _ in range(2))
    cos, sin = _rotation(tokens, head_dim, dtype)
    slots = torch.tensor([3, -1, 7, 0, 12], device=DEVICE)
    caches = [torch.full((4, 4, kv_heads, head_dim), 7.0, device=DEVICE, dtype=dtype) for _ in range(4)]
    out_q, _, _ = tri.qk_norm_rope(q, k, v, q_w, k_w, 1e-6, cos, sin, caches[0], caches[1], slots, v_norm=False)
    f32 = [t.float() for t in (q, k, v, q_w, k_w, cos, sin)]
    ref_q, ref_k, ref_v = torch_ref.qk_norm_rope(*f32[:5], 1e-6, *f32[5:], v_norm=False)
    assert torch.equal(ref_v, f32[2])
    torch_ref.write_kv(ref_k, ref_v, caches[2], caches[3], slots)
    assert_prepared(out_q, ref_q)
    assert_prepared(caches[0], caches[2].float())
    assert torch.equal(caches[1], caches[3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_returns_k_v_without_a_cache_and_q_alone_without_k(dtype):
    q, k = randn(3, 4, 64, dtype=dtype), randn(3, 2, 64, dtype=dtype)
    q_w = randn(64, dtype=dtype) + 1.0
    cos, sin = _rotation(3, 64, dtype)
    out = tri.qk_norm_rope(q, k, k, q_w, q_w, 1e-6, cos, sin)
    ref = torch_ref.qk_norm_rope(*(t.float() for t in (q, k, k, q_w, q_w)), 1e-6, cos.float(), sin.float())
    for got, want in zip(out, ref):
        assert_prepared(got, want)
    only_q = tri.qk_norm_rope(q, None, None, None, None, 1e-6, cos, sin)
    assert only_q[1:] == (None, None)
    assert_prepared(only_q[0], torch_ref.qk_norm_rope(q.float(), None, None, None, None, 1e-6, cos.float(),
                                                     sin.float())[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_scale,with_next", [(False, True), (True, False), (False, False)])
def test_rms_norm_residual_matches_the_separate_ops(dtype, with_scale, with_next):
    x, residual = randn(6, 320, dtype=dtype), randn(6, 320, dtype=dtype)
    weight, next_weight = (randn(320, dtype=dtype) + 1.0 for _ in range(2))
    scale = randn(1, dtype=dtype) if with_scale else None
    nxt = next_weight if with_next else None
    summed, out = tri.rms_norm_residual(x, residual, weight, 1e-6, scale, nxt)
    # the reference in the activation dtype: the fused kernel rounds where the separate ops do
    ref_summed, ref_out = torch_ref.rms_norm_residual(x, residual, weight, 1e-6, scale, nxt)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.05, rtol=2 ** -6)
    torch.testing.assert_close(summed.float(), ref_summed.float(), **tol)
    assert (out is None) == (not with_next)
    if with_next:
        torch.testing.assert_close(out.float(), ref_out.float(), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_update_of_two_joined_branches_matches_the_separate_ops(dtype):
    """A NormedPair in: two branches' output norms summed, then the residual update and the next norm, in one pass
    (b read through a strided view)."""
    a, wide = randn(5, 2816, dtype=dtype) * 3, randn(5, 2 * 2816, dtype=dtype)
    b, residual, scale = wide[:, ::2], randn(5, 2816, dtype=dtype), torch.tensor([0.7], dtype=dtype, device=DEVICE)
    weight_a, weight_b, weight, next_weight = (randn(2816, dtype=dtype) + 1.0 for _ in range(4))
    pair = NormedPair(a, b, weight_a, weight_b)
    joined = (torch_ref.rms_norm(a, weight_a, 1e-6) + torch_ref.rms_norm(b, weight_b, 1e-6)).to(dtype)
    want = torch_ref.rms_norm_residual(joined, residual, weight, 1e-6, scale, next_weight)
    # bf16 rounds at five steps here (the interpreter truncates where torch rounds): a few ulps apart at most
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.05, rtol=2 ** -4)
    for got, expected in zip(tri.rms_norm_residual(pair, residual, weight, 1e-6, scale, next_weight), want):
        torch.testing.assert_close(got.float(), expected.float(), **tol)
    for got, expected in zip(torch_ref.rms_norm_residual(pair, residual, weight, 1e-6, scale, next_weight), want):
        assert torch.equal(got, expected)
    empty = NormedPair(a[:0], b[:0], weight_a, weight_b)
    assert tri.rms_norm_residual(empty, residual[:0], weight, 1e-6)[0].shape == (0, 2816)


def slot_sums_of(y: torch.Tensor):
    """y as the routed experts leave it unsummed (sum_slots(summed=False)): one fp32 row per (token, slot), token
    major, read as PartialSums through a transposed view; and the tensor the slots add up to."""
    from atomlite.model_ops.triton.moe.common import sum_slots
    pair_out = torch.stack([y.float() * 0.5, y.float() * 0.25, y.float() * 0.25], dim=1).reshape(-1, y.shape[-1])
    unsummed = sum_slots(pair_out, y.shape[0], 3, y.dtype, summed=False)
    return unsummed, summed_up(unsummed)


def partial_sums_of(y: torch.Tensor):
    """y split into three fp32 slices (as a split-K GEMM leaves them) that add up to y exactly (so the kernels'
    rounding of the sum is exact under the interpreter too), and the tensor they add up to."""
    from atomlite.model_ops.carriers import PartialSums, summed
    slices = torch.stack([y.float() * 0.25, y.float() * 0.25, y.float() * 0.5])
    unsummed = PartialSums(slices, y.dtype)
    return unsummed, summed(unsummed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_kernels_add_split_k_partial_sums_as_the_separate_sum_would(dtype):
    """x as a split-K GEMM's PartialSums: the kernel adds the slices in order and rounds once, so its results equal
    the same kernel's on the added-up tensor exactly; the torch reference takes PartialSums too."""
    x, residual, b = randn(5, 320, dtype=dtype), randn(5, 320, dtype=dtype), randn(5, 320, dtype=dtype)
    weight, next_weight = (randn(320, dtype=dtype) + 1.0 for _ in range(2))
    unsummed, total = partial_sums_of(x)
    for ops in (tri, torch_ref):
        for got, want in zip(ops.rms_norm_residual(unsummed, residual, weight, 1e-6, None, next_weight),
                             ops.rms_norm_residual(total, residual, weight, 1e-6, None, next_weight)):
            assert torch.equal(got, want)
        unsummed_b, total_b = slot_sums_of(b)
        got = ops.rms_norm_residual(NormedPair(unsummed, unsummed_b, weight, next_weight), residual, weight, 1e-6)
        want = ops.rms_norm_residual(NormedPair(total, total_b, weight, next_weight), residual, weight, 1e-6)
        assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("period,rows", [(8, 1), (8, 2), (2, 3), (1, 5)])
def test_rms_norm_residual_writes_the_next_norm_quantized_as_the_fp8_gemm_reads_it(period, rows):
    """With quantize the next norm's output comes as QuantizedRows: the same values and block scales as the fp8
    GEMM's own quantization of the unquantized output, including K padded past dim (320 -> 512)."""
    from atomlite.model_ops.carriers import InputQuantization
    from atomlite.model_ops.triton.mxfp4.fp8_tiles import quantize_activations
    x, residual = randn(rows, 320, dtype=torch.bfloat16), randn(rows, 320, dtype=torch.bfloat16)
    weight, next_weight = (randn(320, dtype=torch.bfloat16) + 1.0 for _ in range(2))
    summed, out = tri.rms_norm_residual(x, residual, weight, 1e-6, None, next_weight)
    got_summed, quantized = tri.rms_norm_residual(x, residual, weight, 1e-6, None, next_weight,
                                                  quantize=InputQuantization(period, 512))
    values, scales = quantize_activations(out, 512, period)
    assert torch.equal(got_summed, summed)
    assert (quantized.rows, quantized.period, quantized.dtype) == (rows, period, torch.bfloat16)
    assert torch.equal(quantized.values.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(quantized.scales, scales)


@pytest.mark.parametrize("norms", [1, 3])
def test_rms_norm_residual_writes_the_next_norm_per_token_as_the_fp8_gemm_quantizes_it(norms):
    """With TokenQuantization the (first) next norm's output comes as TokenRows: the same e4m3 values and scales as
    quantize_rows gives the unquantized output, an all-zero row included; with three next norms (a MoE layer's
    feed-forward inputs) the other two as plain tensors, as without quantize (e4m3fnuz: the compile gate alone, as
    the interpreter has no such type)."""
    from atomlite.model_ops.carriers import TokenQuantization
    from atomlite.model_ops.triton.fp8.quant import quantize_rows
    fp8_dtype = torch.float8_e4m3fn
    x, residual = randn(3, 320, dtype=torch.bfloat16), randn(3, 320, dtype=torch.bfloat16)
    x[1], residual[1] = 0.0, 0.0
    weight, *nexts = (randn(320, dtype=torch.bfloat16) + 1.0 for _ in range(1 + norms))
    next_weight = nexts[0] if norms == 1 else tuple(nexts)
    summed, outs = tri.rms_norm_residual(x, residual, weight, 1e-6, None, next_weight)
    got_summed, got = tri.rms_norm_residual(x, residual, weight, 1e-6, None, next_weight,
                                            quantize=TokenQuantization(fp8_dtype))
    outs, got = (outs, got) if norms > 1 else ((outs,), (got,))
    values, scales = quantize_rows(outs[0], "token", fp8_dtype)
    assert torch.equal(got_summed, summed)
    rows = got[0]
    assert rows.dtype == torch.bfloat16 and rows.values.dtype == fp8_dtype
    assert torch.equal(rows.values.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(rows.scales, scales)
    for plain, want in zip(got[1:], outs[1:], strict=True):
        assert torch.equal(plain, want)


@pytest.mark.parametrize("norms, first", [(2, False), (2, True), (3, False), (3, True)])
def test_rms_norm_residual_writes_the_last_next_norm_per_token_for_the_experts(norms, first):
    """quantize_last: the last of two or three next norms (a MoE layer's experts' input) comes as TokenRows, the
    e4m3 values and scales quantize_rows gives the unquantized output (an all-zero row included), alone or with the
    first quantized too; the others as without. One next norm has no last to quantize: refused."""
    from atomlite.model_ops.carriers import TokenQuantization
    from atomlite.model_ops.triton.fp8.quant import quantize_rows
    form = TokenQuantization(torch.float8_e4m3fn)
    x, residual = randn(3, 320, dtype=torch.bfloat16), randn(3, 320, dtype=torch.bfloat16)
    x[1], residual[1] = 0.0, 0.0
    weight, *nexts = (randn(320, dtype=torch.bfloat16) + 1.0 for _ in range(1 + norms))
    summed, outs = tri.rms_norm_residual(x, residual, weight, 1e-6, None, tuple(nexts))
    extra = {"quantize": form} if first else {}
    got_summed, got = tri.rms_norm_residual(x, residual, weight, 1e-6, None, tuple(nexts), quantize_last=form,
                                            **extra)
    assert torch.equal(got_summed, summed)
    for i, (out, want) in enumerate(zip(got, outs, strict=True)):
        if i == norms - 1 or (first and i == 0):
            values, scales = quantize_rows(want, "token", torch.float8_e4m3fn)
            assert out.dtype == torch.bfloat16
            assert torch.equal(out.values.view(torch.uint8), values.view(torch.uint8))
            assert torch.equal(out.scales, scales)
        else:
            assert torch.equal(out, want)
    with pytest.raises(ValueError, match="quantize_last"):
        tri.rms_norm_residual(x, residual, weight, 1e-6, None, nexts[0], quantize_last=form)


@pytest.mark.parametrize("platform, rows, token, warps", [("sm_90", 1, True, 32), ("sm_90", 16, True, 32),
                                                          ("sm_90", 64, True, 16), ("sm_90", 1, False, 16),
                                                          ("gfx942", 1, True, 16), ("gfx950", 1, True, 16)])
def test_a_few_token_rows_of_31b_take_a_thread_per_16_bytes_on_nvidia(platform, rows, token, warps):
    """31B's residual update (5376 columns, padded to 8192) at up to TOKEN_ROWS_FEW_ROWS rows written as TokenRows
    runs 1024 threads on NVIDIA (32 warps; norm/tuning.py says why), else 16 warps: wave64 AMD GPUs hold no more than
    16 warps of 64 lanes a program. Recorded as launched there, not run."""
    from atomlite.model_ops.carriers import TokenQuantization
    from atomlite.model_ops.platform import parse_platform
    from atomlite.model_ops.triton.common import recording
    from atomlite.model_ops.triton.norm.residual import rms_norm_residual
    x, residual, weight, next_weight = (torch.empty(shape, dtype=torch.bfloat16, device="meta")
                                        for shape in ((rows, 5376), (rows, 5376), (5376,), (5376,)))
    quantize = TokenQuantization(parse_platform(platform).fp8_dtype) if token else None
    with recording(parse_platform(platform)) as launches:
        rms_norm_residual(x, residual, weight, 1e-6, None, next_weight, quantize=quantize)
    [launch] = launches
    assert launch.kwargs["num_warps"] == warps


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_residual_gives_several_next_norms_of_the_sum(dtype):
    """A tuple of next weights (a MoE layer's three feed-forward inputs): one norm of the sum under each, as the
    separate norms give them, from a split-K output."""
    x, residual = randn(4, 320, dtype=dtype), randn(4, 320, dtype=dtype)
    weight, *nexts = (randn(320, dtype=dtype) + 1.0 for _ in range(4))
    unsummed, _ = partial_sums_of(x)
    summed, outs = tri.rms_norm_residual(unsummed, residual, weight, 1e-6, None, tuple(nexts))
    ref_summed, ref_outs = torch_ref.rms_norm_residual(unsummed, residual, weight, 1e-6, None, tuple(nexts))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.05, rtol=2 ** -6)
    torch.testing.assert_close(summed.float(), ref_summed.float(), **tol)
    assert len(outs) == len(ref_outs) == 3
    for got, want, w in zip(outs, ref_outs, nexts):
        torch.testing.assert_close(got.float(), want.float(), **tol)
        torch.testing.assert_close(want, torch_ref.rms_norm(ref_summed, w, 1e-6))
    two = tri.rms_norm_residual(unsummed, residual, weight, 1e-6, None, tuple(nexts[:2]))[1]
    assert len(two) == 2 and torch.equal(two[1], outs[1])


@pytest.mark.parametrize("splits", [2, 3])
def test_qk_norm_rope_adds_a_split_k_projections_slices_as_it_reads_them(splits):
    """q, k, v as PartialSums of one QKV projection: the result of summing the slices first (rounded to bf16),
    written to the cache alike; v the raw k's columns, as on a k_eq_v layer."""
    from atomlite.model_ops.carriers import PartialSums, as_heads, split_columns, summed
    tokens, heads, kv_heads, head_dim = 3, 4, 2, 64
    slices = randn(splits, tokens, (heads + kv_heads) * head_dim, dtype=torch.float32)
    q, k = (as_heads(p, head_dim) for p in split_columns(PartialSums(slices, torch.bfloat16),
                                                           [heads * head_dim, kv_heads * head_dim]))
    q_w, k_w = (randn(head_dim, dtype=torch.bfloat16) + 1.0 for _ in range(2))
    cos, sin = _rotation(tokens, head_dim, torch.bfloat16)
    slots = torch.tensor([3, -1, 7], device=DEVICE)
    caches = [torch.full((4, 4, kv_heads, head_dim), 7.0, device=DEVICE, dtype=torch.bfloat16) for _ in range(4)]
    got_q, _, _ = tri.qk_norm_rope(q, k, k, q_w, k_w, 1e-6, cos, sin, caches[0], caches[1], slots)
    want_q, _, _ = tri.qk_norm_rope(summed(q), summed(k), summed(k), q_w, k_w, 1e-6, cos, sin, caches[2], caches[3],
                                    slots)
    assert got_q.dtype == torch.bfloat16
    for got, want in ((got_q, want_q), (caches[0], caches[2]), (caches[1], caches[3])):
        assert_prepared(got, want.float())
    ref_q, _, _ = torch_ref.qk_norm_rope(q, k, k, q_w.float(), k_w.float(), 1e-6, cos.float(), sin.float())
    assert_prepared(got_q, ref_q.float())
