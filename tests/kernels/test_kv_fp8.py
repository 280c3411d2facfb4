"""--kv-cache-dtype fp8: e4m3 caches with unit scales. Writes saturate, every attention path reads fp8 and computes
in the activations' dtype. On CPU the interpreter runs the Triton kernels; its own fp32 -> fp8 conversion (Triton
3.7.1) flushes subnormals and halves values that round to an exact power of two, so written values are compared
where that conversion is right (on a GPU, everywhere)."""
from pathlib import Path

import pytest
import torch

from atomlite import LLM
from atomlite.config import EngineConfig
from atomlite.errors import ConfigError
from atomlite.model_ops import torch_ref
from atomlite.model_ops import triton as tri
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.torch_ref.kv_write import to_cache_dtype
from atomlite.plan import plan_report
from helpers import atomlite_prompt_logprobs, random_prompt
from test_k_from_v import key_rule
from test_triton_attention import DEVICE, K_LENS, Q_LENS, paged_batch

FP8 = torch.float8_e4m3fn
EXAMPLES = Path(__file__).parents[2] / "examples" / "configs"


def test_fp8_is_e4m3fnuz_on_gfx942_and_e4m3fn_elsewhere():
    config = EngineConfig(model=str(EXAMPLES / "gemma-4-31B-it"), kv_cache_dtype="fp8")
    assert config.kv_dtype(Platform("rocm", "gfx942")) == torch.float8_e4m3fnuz
    assert config.kv_dtype(Platform("rocm", "gfx950")) == FP8 == config.kv_dtype(Platform("cuda", "sm_90"))
    assert EngineConfig(model=str(EXAMPLES / "gemma-4-31B-it")).kv_dtype(Platform()) == torch.bfloat16
    with pytest.raises(ConfigError, match="--kv-cache-dtype fp4 is not one of"):
        EngineConfig(model=str(EXAMPLES / "gemma-4-31B-it"), kv_cache_dtype="fp4")


@pytest.mark.parametrize("platform", [Platform("cuda", "sm_80"), Platform("rocm", "gfx90a")])
def test_fp8_on_a_gpu_without_e4m3_is_a_clear_error(platform):
    config = EngineConfig(model=str(EXAMPLES / "gemma-4-31B-it"), kv_cache_dtype="fp8")
    with pytest.raises(ConfigError, match="needs e4m3 support .* use --kv-cache-dtype auto"):
        config.kv_dtype(platform)
    assert Platform("cuda", "sm_89").has_fp8 and Platform("cpu").has_fp8


def test_plan_with_fp8_halves_every_group():
    config = EngineConfig(model=str(EXAMPLES / "gemma-4-31B-it"), max_model_len=131072, kv_cache_dtype="fp8")
    _, plan = plan_report(config, 100 * 2**30, Platform())
    assert {g.spec.kind: g.bytes_per_token / 1024 for g in plan.groups} == {"sliding": 400.0, "full": 20.0}


def test_writes_saturate_at_the_largest_fp8_value():
    values = torch.tensor([500.0, -600.0, 1.0, 3e-3])
    assert to_cache_dtype(values, FP8).float().tolist()[:3] == [448.0, -448.0, 1.0]
    assert to_cache_dtype(values, torch.float8_e4m3fnuz).float().tolist()[:2] == [240.0, -240.0]


def fp8_batch(head_dim, window, dtype=torch.float32, seed=0):
    q, k_cache, v_cache, table, seq_lens, starts = paged_batch(Q_LENS, K_LENS, 4, 2, head_dim, 16, dtype, window,
                                                               DEVICE, seed)
    return q, to_cache_dtype(k_cache, FP8), to_cache_dtype(v_cache, FP8), table, seq_lens, starts


@pytest.mark.parametrize("head_dim,window", [(64, None), (256, 8)])
def test_triton_attention_reads_fp8_caches_like_the_reference(head_dim, window):
    args = fp8_batch(head_dim, window)
    out = tri.paged_attention(*args, head_dim ** -0.5, window)
    ref = torch_ref.paged_attention(*args, head_dim ** -0.5, window)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_triton_v_only_attention_reads_an_fp8_cache_like_the_reference():
    q, _, v_cache, table, seq_lens, starts = fp8_batch(64, None, seed=1)
    rule = key_rule(64, 0.25, DEVICE)
    out = tri.paged_attention(q, None, v_cache, table, seq_lens, starts, 0.125, k_from_v=rule)
    ref = torch_ref.paged_attention(q, None, v_cache, table, seq_lens, starts, 0.125, k_from_v=rule)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 4.0)])  # unit, and a checkpoint's (test_kv_scales.py)
@pytest.mark.parametrize("store_k", [True, False])
def test_triton_qk_norm_rope_writes_fp8_like_the_reference(store_k, scales):
    gen = torch.Generator().manual_seed(2)
    tokens, heads, kv_heads, dim = 5, 4, 2, 64
    q, k, v = (torch.randn(tokens, h, dim, generator=gen).to(DEVICE) * 3 for h in (heads, kv_heads, kv_heads))
    weight = torch.rand(dim, generator=gen).to(DEVICE) + 0.5
    cos, sin = torch.randn(tokens, dim, generator=gen).to(DEVICE), torch.randn(tokens, dim, generator=gen).to(DEVICE)
    slots = torch.tensor([3, -1, 0, 7, 12], device=DEVICE)
    caches = {}
    for name, op in (("ref", torch_ref.qk_norm_rope), ("triton", tri.qk_norm_rope)):
        k_cache = torch.zeros(2, 8, kv_heads, dim, dtype=FP8, device=DEVICE) if store_k else None
        v_cache = torch.zeros(2, 8, kv_heads, dim, dtype=FP8, device=DEVICE)
        q_out, _, _ = op(q, k, v, weight, weight, 1e-6, cos, sin, k_cache, v_cache, slots, kv_scales=scales)
        caches[name] = (q_out, k_cache, v_cache)
    (q_ref, k_ref, v_ref), (q_tri, k_tri, v_tri) = caches["ref"], caches["triton"]
    torch.testing.assert_close(q_tri, q_ref, atol=1e-5, rtol=1e-5)
    assert_fp8_equal(v_tri, v_ref)
    if store_k:
        assert_fp8_equal(k_tri, k_ref)


def assert_fp8_equal(written: torch.Tensor, expected: torch.Tensor) -> None:
    written, expected = written.float(), expected.float()
    if DEVICE == "cpu":
        trusted = (torch.frexp(expected).mantissa.abs() != 0.5) & (expected.abs() >= 2.0 ** -6)
        assert trusted.sum() > 0.8 * (expected != 0).sum()  # most written values are checked
        written, expected = written[trusted], expected[trusted]
    torch.testing.assert_close(written, expected, atol=0, rtol=0)


# The reference kernels only: the interpreter's fp8 conversion (see above) would be measured along.
@pytest.mark.parametrize("backend", ["torch"])
def test_fp8_kv_stays_close_to_float32_kv_on_the_parity_model(checkpoints, backend):
    path, _ = checkpoints.get("dense")
    ids = random_prompt(40, seed=1)
    logprobs = {dtype: atomlite_prompt_logprobs(LLM(str(path), dtype="float32", device="cpu",
                                                    kernel_backend=backend, kv_cache_dtype=dtype), ids, 96)
                for dtype in ("auto", "fp8")}
    deviation = (logprobs["fp8"] - logprobs["auto"]).abs()
    print(f"fp8 KV, {backend}: |logprob| deviation mean {deviation.mean():.4f}, max {deviation.max():.4f}")
    assert 0 < deviation.mean() < 0.3 and deviation.max() < 3.0
