"""Per-layer K/V scales of an fp8 cache: it holds k / k_scale and v / v_scale, and every path reads them back times
the scale. The reference is checked against attention over the caches' dequantized values; the Triton kernels
(interpreter on CPU, compiled on a GPU) and their writes against the reference (the fused q/k norm + RoPE + write at
these scales: test_kv_fp8.py). A 16-bit cache ignores scales."""
import pytest
import torch

from atomlite.engine.kv.kv_scales import apply_kv_scales
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.model_ops import torch_ref
from atomlite.model_ops import triton as tri
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.triton.attention import paged
from atomlite.model_ops.context import HostBatch
from atomlite.model_ops.torch_ref.kv_write import to_cache_dtype
from atomlite.quant.quark import KVCacheQuant
from test_k_from_v import key_rule
from test_kv_fp8 import FP8, assert_fp8_equal
from test_triton_attention import DEVICE, K_LENS, Q_LENS, paged_batch

SCALES = (0.5, 4.0)  # K, V: one shrinks the stored values, one grows them


def scaled_batch(q_lens, k_lens, head_dim, window, seed=0):
    """q and fp8 caches holding K / 0.5 and V / 4, and the same caches dequantized (float32, unit scales)."""
    q, k, v, table, seq_lens, starts = paged_batch(q_lens, k_lens, 4, 2, head_dim, 16, torch.float32, window,
                                                   DEVICE, seed)
    k8, v8 = to_cache_dtype(k, FP8, SCALES[0]), to_cache_dtype(v, FP8, SCALES[1])
    plain = (q, k8.float() * SCALES[0], v8.float() * SCALES[1], table, seq_lens, starts)
    return (q, k8, v8, table, seq_lens, starts), plain


def test_an_fp8_cache_stores_values_over_their_scale_and_a_16_bit_cache_ignores_it():
    x = torch.tensor([[[3.0, -96.0, 0.25, 2000.0]]])
    assert to_cache_dtype(x, FP8, 4.0).float().flatten().tolist() == [0.75, -24.0, 0.0625, 448.0]
    cache8 = torch.zeros(1, 2, 1, 4, dtype=FP8)
    cache16 = torch.zeros(1, 2, 1, 4, dtype=torch.bfloat16)
    slots = torch.tensor([1])
    torch_ref.write_kv(x, x, cache8, cache16, slots, kv_scales=(4.0, 4.0))
    assert cache8[0, 1].float().flatten().tolist() == [0.75, -24.0, 0.0625, 448.0]
    assert cache16[0, 1].float().flatten().tolist() == [3.0, -96.0, 0.25, 2000.0]


@pytest.mark.parametrize("head_dim,window", [(64, None), (256, 8)])
def test_reference_reads_a_scaled_cache_as_its_dequantized_values(head_dim, window):
    scaled, plain = scaled_batch(Q_LENS, K_LENS, head_dim, window)
    out = torch_ref.paged_attention(*scaled, head_dim ** -0.5, window, kv_scales=SCALES)
    want = torch_ref.paged_attention(*plain, head_dim ** -0.5, window)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    unscaled = torch_ref.paged_attention(*scaled, head_dim ** -0.5, window)
    assert (unscaled - want).abs().max() > 0.1  # the scales matter in this batch


@pytest.mark.parametrize("head_dim,window,decode", [(64, None, False), (256, 8, False), (64, None, True)])
def test_triton_reads_a_scaled_cache_like_the_reference(head_dim, window, decode):
    """Prefill tiles and split-KV decode (one query per sequence over long contexts)."""
    q_lens, k_lens = ([1, 1, 1], [300, 40, 129]) if decode else (Q_LENS, K_LENS)
    scaled, _ = scaled_batch(q_lens, k_lens, head_dim, window, seed=1)
    out, lse = tri.paged_attention(*scaled, head_dim ** -0.5, window, True, kv_scales=SCALES)
    ref, ref_lse = torch_ref.paged_attention(*scaled, head_dim ** -0.5, window, True, kv_scales=SCALES)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("built", [False, True])
def test_v_only_layers_rebuild_keys_from_the_scaled_values(built, monkeypatch):
    """K = rope(V w): keys rebuilt from a scaled V cache carry V's scale, in the kernel and when a prefill builds
    them once (host lengths given, and keys no larger than q)."""
    q_lens, k_lens = ([20, 12], [20, 30]) if built else (Q_LENS, K_LENS)
    scaled, plain = scaled_batch(q_lens, k_lens, 64, None, seed=2)
    q, _, v8, table, seq_lens, starts = scaled
    rule = key_rule(64, 0.25, DEVICE)
    host = HostBatch.of(starts.tolist(), seq_lens.tolist()) if built else None
    builds, build = [], paged.build_keys
    monkeypatch.setattr(paged, "build_keys", lambda *a: builds.append(1) or build(*a))
    out = tri.paged_attention(q, None, v8, table, seq_lens, starts, 0.125, k_from_v=rule, host=host,
                              derived={} if built else None, kv_scales=SCALES)
    assert len(builds) == built
    ref = torch_ref.paged_attention(q, None, v8, table, seq_lens, starts, 0.125, k_from_v=rule, kv_scales=SCALES)
    want = torch_ref.paged_attention(q, None, plain[2], table, seq_lens, starts, 0.125, k_from_v=rule)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_triton_writes_scaled_values_like_the_reference():
    gen = torch.Generator().manual_seed(3)
    k, v = (torch.randn(6, 2, 64, generator=gen).to(DEVICE) * 3 for _ in range(2))
    slots = torch.tensor([3, -1, 0, 7, 12, 9], device=DEVICE)
    written = {}
    for name, op in (("ref", torch_ref.write_kv), ("triton", tri.write_kv)):
        caches = [torch.zeros(2, 8, 2, 64, dtype=FP8, device=DEVICE) for _ in range(2)]
        op(k, v, *caches, slots, kv_scales=SCALES)
        written[name] = caches
    for got, want in zip(written["triton"], written["ref"]):
        assert_fp8_equal(got, want)


@pytest.mark.parametrize("scales", [(0.0, 1.0), (1.0, -2.0), (float("nan"), 1.0), (1.0, float("inf"))])
def test_a_layer_refuses_scales_that_are_not_finite_and_positive(scales):
    layer = Attention(4, 2, 64, 0.125, None)
    with pytest.raises(ValueError, match="finite and positive"):
        layer.set_kv_scales(*scales)
    layer.set_kv_scales(0.25, 2)
    assert layer.kv_scales == (0.25, 2.0)


class _Layers:
    """What apply_kv_scales reads of a model: its attention layers and the checkpoint's scales."""

    def __init__(self, count: int, found: dict):
        self.layers = [Attention(4, 2, 64, 0.125, None) for _ in range(count)]
        self.checkpoint_kv_scales = found

    def attention_layers(self):
        return self.layers


SPECS = [KVSpec("sliding", 2, 64, FP8, 8), KVSpec("full", 2, 64, FP8, None, k_from_v=True),
         KVSpec("shared", target=0)]
FOUND = {(0, "k"): 0.5, (0, "v"): 0.25, (1, "k"): 2.0, (2, "k"): 9.0, (2, "v"): 9.0}


def test_each_layer_takes_its_scales_and_a_sharing_layer_its_targets():
    """Layer 1 (V alone cached, no V scale in the checkpoint) keeps V at 1; layer 2 reads layer 0's cache, so it
    reads with layer 0's scales, whatever the checkpoint says of its own projections."""
    model = _Layers(3, FOUND)
    note = apply_kv_scales(model, SPECS, KVCacheQuant(post_rope=True), FP8)
    assert [layer.kv_scales for layer in model.layers] == [(0.5, 0.25), (2.0, 1.0), (0.5, 0.25)]
    assert note.startswith("fp8 KV cache: the checkpoint's per-layer scales (K 0.5-2, V 0.25-1")


@pytest.mark.parametrize("quant,found,cache,says", [
    (KVCacheQuant(post_rope=False), FOUND, FP8, "before the K/V norms"),
    (KVCacheQuant(post_rope=True), {}, FP8, "the checkpoint has no KV scales"),
    (None, FOUND, FP8, "the checkpoint has no KV scales"),
    (KVCacheQuant(post_rope=True), FOUND, torch.bfloat16, None)])
def test_scales_that_do_not_describe_the_cache_leave_it_at_unit_scales(quant, found, cache, says):
    model = _Layers(3, found)
    note = apply_kv_scales(model, SPECS, quant, cache)
    assert all(layer.kv_scales == (1.0, 1.0) for layer in model.layers)
    assert note is None if says is None else says in note
