"""Layers whose K is a function of V store V alone: K = rope(V * w_k), rebuilt by the attention kernels.

The reference is checked against attention over an explicitly built K cache; the Triton kernel (interpreter on
CPU, compiled on a GPU) against the reference, through prefill, decode, split-KV, windows and GQA.
"""
import pytest
import torch

from atomlite import LLM
from atomlite.model_ops import torch_ref
from atomlite.model_ops.context import HostBatch
from atomlite.model_ops.k_from_v import KFromV, rotary_pairs
from atomlite.model_ops.rope import RotaryEmbedding, default_inv_freq, proportional_inv_freq
from atomlite.model_ops.torch_ref.attention import keys_from_values
from atomlite.model_ops.triton.attention import paged as tri
from helpers import greedy, random_prompt
from test_triton_attention import DEVICE, K_LENS, Q_LENS, paged_batch

MAX_POSITIONS = 1024


def key_rule(head_dim: int, partial: float | None, device: str = "cpu", seed: int = 0) -> KFromV:
    inv_freq = (default_inv_freq(head_dim, 10_000.0) if partial is None
                else proportional_inv_freq(head_dim, 1_000_000.0, partial))
    rope = RotaryEmbedding(head_dim, inv_freq, MAX_POSITIONS)
    weight = 1.0 + 0.5 * torch.rand(head_dim, generator=torch.Generator().manual_seed(seed)) - 0.25
    return KFromV(weight.to(device), rope.cos_table.to(device), rope.sin_table.to(device), rotary_pairs(inv_freq))


def explicit_k_cache(v_cache, block_table, seq_lens, rule: KFromV) -> torch.Tensor:
    """K for every stored slot, computed from V at the slot's position (blocks no sequence owns stay NaN)."""
    k_cache = torch.full_like(v_cache, float("nan"))
    block_size = v_cache.shape[1]
    for b, length in enumerate(seq_lens.tolist()):
        for i in range(-(-length // block_size)):
            block = int(block_table[b, i])
            if block == 0:
                continue  # dropped before the window
            positions = torch.arange(i * block_size, (i + 1) * block_size, device=v_cache.device)
            k_cache[block] = torch_ref.attention.keys_from_values(v_cache[block], positions, rule)
    return k_cache


def test_rotary_pairs_counts_the_turning_frequencies():
    assert rotary_pairs(default_inv_freq(64, 10_000.0)) == 32
    assert rotary_pairs(proportional_inv_freq(512, 1e6, 0.25)) == 64
    with pytest.raises(ValueError, match="rotating frequencies first"):
        rotary_pairs(torch.tensor([1.0, 0.0, 0.5]))


@pytest.mark.parametrize("partial,window", [(0.25, None), (None, 6)])
def test_reference_equals_attention_over_an_explicit_k_cache(partial, window):
    q, _, v_cache, table, seq_lens, starts = paged_batch(Q_LENS, K_LENS, 4, 2, 64, 16, torch.float32, window)
    rule = key_rule(64, partial)
    k_cache = explicit_k_cache(v_cache, table, seq_lens, rule)
    expected = torch_ref.paged_attention(q, k_cache, v_cache, table, seq_lens, starts, 0.125, window)
    derived = torch_ref.paged_attention(q, None, v_cache, table, seq_lens, starts, 0.125, window, k_from_v=rule)
    torch.testing.assert_close(derived, expected, atol=1e-5, rtol=1e-5)


def assert_matches_reference(out, args, scale, window, rule, return_lse):
    upcast = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    ref_out, ref_lse = torch_ref.paged_attention(*upcast, scale, window, True, k_from_v=rule)
    out, lse = out if return_lse else (out, None)
    assert not out.isnan().any()
    tolerance = 2e-5 if out.dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref_out, atol=tolerance, rtol=tolerance)
    if lse is not None:  # bf16: the rebuilt rotated columns are rounded to bf16 for the MMA
        lse_tolerance = 1e-4 if out.dtype == torch.float32 else 5e-3
        torch.testing.assert_close(lse, ref_lse, atol=lse_tolerance, rtol=lse_tolerance)


@pytest.mark.parametrize("head_dim,num_heads,num_kv_heads,block_size,window,partial,dtype,return_lse", [
    (64, 4, 2, 16, None, 0.25, torch.float32, True),  # 8 rotated pairs: padded to a 16-column tile
    (64, 2, 1, 16, 8, None, torch.float32, False),  # every pair rotates, window smaller than a block
    (256, 8, 1, 32, None, 0.25, torch.float32, True),  # GQA 8
    (512, 4, 2, 16, None, 0.25, torch.bfloat16, True),  # Gemma 4's global layers: 64 of 256 pairs turn
])
@pytest.mark.parametrize("host_lengths", [False, True])
def test_triton_derived_keys_match_reference(head_dim, num_heads, num_kv_heads, block_size, window, partial, dtype,
                                             return_lse, host_lengths, monkeypatch):
    """With the lengths on the host, a prefill without a window builds its keys once for the step (where they fit)."""
    args = paged_batch(Q_LENS, K_LENS, num_heads, num_kv_heads, head_dim, block_size, dtype, window, DEVICE, seed=3)
    q, _, v_cache, table, seq_lens, starts = args
    rule = key_rule(head_dim, partial, DEVICE)
    rule = KFromV(rule.weight.to(dtype), rule.cos, rule.sin, rule.rotary_pairs)
    scale = head_dim ** -0.5
    host = HostBatch.of(starts.tolist(), seq_lens.tolist()) if host_lengths else None
    builds, build_keys = [], tri.build_keys
    monkeypatch.setattr(tri, "build_keys", lambda *a, **kw: (builds.append(1), build_keys(*a, **kw))[1])
    out = tri.paged_attention(q, None, v_cache, table, seq_lens, starts, scale, window, return_lse, k_from_v=rule,
                              host=host, derived={})
    # built when the step's keys take no more memory than q: so for GQA 8 here, not for 2 query heads per KV head
    fits = sum(K_LENS) * num_kv_heads <= sum(Q_LENS) * num_heads
    assert len(builds) == (host_lengths and window is None and fits)
    assert_matches_reference(out, (q, None, v_cache, table, seq_lens, starts), scale, window, rule, return_lse)


@pytest.mark.parametrize("window", [None, 48])
def test_triton_derived_keys_with_split_kv_match_reference(window):
    q, _, v_cache, table, seq_lens, starts = paged_batch([1, 5, 1], [130, 70, 9], 4, 2, 64, 16, torch.float32,
                                                         window, DEVICE, seed=4)
    rule = key_rule(64, 0.25, DEVICE)
    config = tri.AttnConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, num_splits=3)
    out = tri.launch(q, None, v_cache, table, seq_lens, starts, 0.125, window, True, config, rule)
    assert_matches_reference(out, (q, None, v_cache, table, seq_lens, starts), 0.125, window, rule, True)


@pytest.mark.parametrize("built", [False, True])
def test_value_parts_with_keys_from_values_match_reference(built):
    """Each of two programs a query tile scores with the whole derived (or built) keys and sums half the values."""
    q, _, v_cache, table, seq_lens, starts = paged_batch([33, 5, 1], [40, 70, 9], 4, 2, 64, 16, torch.float32,
                                                         None, DEVICE, seed=7)
    rule = key_rule(64, 0.25, DEVICE)
    keys = None
    if built:
        lengths = seq_lens.tolist()
        keys = tri.build_keys(v_cache, table, seq_lens, tri.key_row_starts(lengths, DEVICE), sum(lengths),
                              max(lengths), rule, torch.float32)
    config = tri.AttnConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, value_parts=2)
    out = tri.launch(q, None, v_cache, table, seq_lens, starts, 0.125, None, True, config, rule, keys)
    assert_matches_reference(out, (q, None, v_cache, table, seq_lens, starts), 0.125, None, rule, True)


def test_built_keys_equal_the_reference_keys_and_serve_a_split_kv_launch():
    q, _, v_cache, table, seq_lens, starts = paged_batch([1, 5, 1], [130, 70, 9], 4, 2, 64, 16, torch.float32,
                                                         None, DEVICE, seed=6)
    rule = key_rule(64, 0.25, DEVICE)
    lengths = seq_lens.tolist()
    row_starts = tri.key_row_starts(lengths, DEVICE)
    built = tri.build_keys(v_cache, table, seq_lens, row_starts, sum(lengths), max(lengths), rule, torch.float32)
    for b, n in enumerate(lengths):
        blocks = table[b, :-(-n // 16)].long()
        v = v_cache[blocks].reshape(-1, 2, 64)[:n]
        want = keys_from_values(v, torch.arange(n, device=DEVICE), rule, torch.float32)
        torch.testing.assert_close(built.keys[row_starts[b]:row_starts[b] + n], want, atol=1e-6, rtol=1e-6)
    config = tri.AttnConfig(block_m=16, block_n=16, num_warps=4, num_stages=1, num_splits=3)
    out = tri.launch(q, None, v_cache, table, seq_lens, starts, 0.125, None, True, config, rule, built)
    assert_matches_reference(out, (q, None, v_cache, table, seq_lens, starts), 0.125, None, rule, True)


@pytest.mark.parametrize("capacity", [400, 100])
def test_step_keys_built_on_the_device_are_the_prefilling_sequences_that_fit(capacity):
    """Without host lengths (a prefill graph), the sequences of more than a decode's queries are built in order while
    their keys fit; the others get row start -1."""
    q_lens, k_lens = [1, 30, 3, 12, 20, 0], [90, 40, 3, 50, 20, 7]
    q, _, v_cache, table, seq_lens, starts = paged_batch(q_lens, k_lens, 4, 2, 64, 16, torch.float32, None, DEVICE,
                                                         seed=8)
    rule = key_rule(64, 0.25, DEVICE)
    built = tri.build_step_keys(v_cache, table, seq_lens, starts, capacity, rule, torch.float32)
    want_starts = [-1, 0, -1, 40, 90, -1] if capacity == 400 else [-1, 0, -1, 40, -1, -1]
    assert built.partial and built.row_starts.tolist() == want_starts
    for b, start in enumerate(want_starts):
        if start >= 0:
            n = k_lens[b]
            v = v_cache[table[b, :-(-n // 16)].long()].reshape(-1, 2, 64)[:n]
            want = keys_from_values(v, torch.arange(n, device=DEVICE), rule, torch.float32)
            torch.testing.assert_close(built.keys[start:start + n], want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("num_heads", [8, 2])
def test_prefill_without_host_lengths_builds_what_fits_and_derives_the_rest(num_heads):
    """A prefill graph's attention on a V-only layer: keys built for the prefilling sequences where they fit q's
    size (all of them with GQA 8; with 2 query heads per KV head the second's long prefix does not fit), derived
    for the rest, every row as the reference has it."""
    q_lens, k_lens = [1, 12, 30, 2], [90, 50, 140, 9]
    q, _, v_cache, table, seq_lens, starts = paged_batch(q_lens, k_lens, num_heads, 1, 64, 16, torch.float32, None,
                                                         DEVICE, seed=9)
    rule = key_rule(64, 0.25, DEVICE)
    host = HostBatch(None, None, max_query_len=64, max_seq_len=256, decode_only=False)
    builds, build = [], tri.build_step_keys

    def record(*args, **kwargs):
        built = build(*args, **kwargs)
        builds.append(built.row_starts.tolist())
        return built

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tri, "build_step_keys", record)
        out, lse = tri.paged_attention(q, None, v_cache, table, seq_lens, starts, 0.125, None, True, k_from_v=rule,
                                       host=host)
    assert builds == ([[-1, 0, 50, -1]] if num_heads == 8 else [[-1, 0, -1, -1]])
    assert_matches_reference((out, lse), (q, None, v_cache, table, seq_lens, starts), 0.125, None, rule, True)


def test_k_eq_v_layers_store_v_alone(checkpoints):
    path, _ = checkpoints.get("dense")
    llm = LLM(str(path), dtype="float32", device="cpu")
    engine = llm.engine
    specs = engine.model.kv_specs(torch.float32)
    derived = [i for i, spec in enumerate(specs) if spec.k_from_v]
    assert derived and all(specs[i].kind == "full" for i in derived)
    for i in derived:
        k_cache, v_cache, _ = engine.runner.kv.cache_for_layer(i)
        assert k_cache is None and v_cache is not None
        assert specs[i].bytes_per_token == specs[i].num_kv_heads * specs[i].head_dim * 4


def test_greedy_tokens_equal_between_torch_and_triton_with_derived_keys(checkpoints):
    path, _ = checkpoints.get("moe")
    prompts = [random_prompt(n, seed=n) for n in (3, 17, 30)]
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(path), dtype="float32", device="cpu", kernel_backend=backend)
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(6))]
    assert tokens["torch"] == tokens["triton"]
