"""Image blocks that attend both ways (Gemma 4 31B / 26B-A4B sliding layers, use_bidirectional_attention "vision"):
a query sees key k iff k > q - W and (k <= q or q and k are soft tokens of the same image block).

The oracle is transformers' own mask (create_masks_for_vision_model, or its masking functions without a window);
the reference is checked against dense attention under it, the Triton kernel (interpreter on CPU) against the
reference, and the text-only path (key_ends None) against plainly causal key ends.
"""
from dataclasses import dataclass

import pytest
import torch

from atomlite.model_ops import dispatch, torch_ref
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.context import ForwardContext, GroupBatch, HostBatch, block_key_ends
from atomlite.model_ops.k_from_v import KFromV
from atomlite.model_ops.platform import Platform
from atomlite.model_ops.torch_ref.attention import keys_from_values
from atomlite.model_ops.torch_ref.kv_write import to_cache_dtype
from atomlite.model_ops.triton.attention import paged as tri
from test_k_from_v import key_rule
from test_torch_ref_attention import paged
from test_triton_attention import DEVICE, assert_close_to_reference, paged_batch

TEXT, IMAGE, VIDEO = 0, 1, 2  # transformers' mm_token_type_ids
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Sequence:
    """A sequence's token types and how many of its tokens were in the cache before the step."""
    types: tuple[int, ...]
    cached: int = 0

    @property
    def length(self) -> int:
        return len(self.types)

    @property
    def new(self) -> int:
        return self.length - self.cached

    def key_ends(self) -> list[int]:
        return block_key_ends([t != TEXT for t in self.types])[self.cached:]


def seq(*runs: tuple[int, int], cached: int = 0) -> Sequence:
    return Sequence(tuple(t for kind, count in runs for t in [kind] * count), cached)


CASES = {
    "an image block crossing nothing": seq((TEXT, 3), (IMAGE, 6), (TEXT, 3)),
    "two image blocks, the second a video": seq((TEXT, 1), (IMAGE, 4), (TEXT, 2), (VIDEO, 5), (TEXT, 1)),
    "an image block at the very start": seq((IMAGE, 7), (TEXT, 3)),
    "a cached prefix, the block inside the step": seq((TEXT, 8), (IMAGE, 6), (TEXT, 2), cached=6),
    "text only": seq((TEXT, 9)),
    "a decode step after an image": seq((TEXT, 2), (IMAGE, 5), (TEXT, 2), cached=8),
    "long blocks over several key tiles": seq((TEXT, 10), (IMAGE, 20), (TEXT, 3), (IMAGE, 6), (TEXT, 2), cached=4),
}
BATCH = list(CASES.values())
WINDOWS = [3, 8, None]  # 3: smaller than every image block


def transformers_mask(sequence: Sequence, window: int | None) -> torch.Tensor:
    """[L, L] bool: the sliding layers' mask transformers' Gemma 4 builds under use_bidirectional_attention "vision";
    without a window, its causal mask OR its blockwise overlay."""
    # imported here: the GPU machines' transformers may predate Gemma 4's vision masks, and the kernel tests below
    # need none of it
    from transformers import Gemma4TextConfig
    from transformers.masking_utils import blockwise_overlay, causal_mask_function, or_masks
    from transformers.models.gemma4.modeling_gemma4 import (create_masks_for_vision_model,
                                                            get_block_sequence_ids_for_mask)
    block_ids = get_block_sequence_ids_for_mask(torch.tensor([sequence.types]), torch.device("cpu"))
    positions = torch.arange(sequence.length)
    if window is None:
        visible = or_masks(causal_mask_function, blockwise_overlay(block_ids))
        return visible(torch.tensor(0), torch.tensor(0), positions[:, None], positions[None, :])
    config = Gemma4TextConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                              head_dim=8, vocab_size=16, sliding_window=window,
                              layer_types=["sliding_attention", "full_attention"],
                              use_bidirectional_attention="vision")
    config._attn_implementation = "sdpa"
    masks = create_masks_for_vision_model(config, torch.zeros(1, sequence.length, 8), None, None, positions[None],
                                          block_ids)
    return masks["sliding_attention"][0, 0]


def dense_attention(q, k, v, visible, scale):
    """float64 softmax attention: q [Lq, Hq, D], k/v [Lk, Hkv, D], visible [Lq, Lk]."""
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double().repeat_interleave(group, 1)) * scale
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
    return torch.einsum("hqk,khd->qhd", weights, v.double().repeat_interleave(group, 1))


def step_lengths(batch: list[Sequence]):
    """(query_start_loc, seq_lens, key_ends) of a step over the batch."""
    starts = torch.tensor([0] + [s.new for s in batch], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor([s.length for s in batch], dtype=torch.int32)
    key_ends = torch.tensor([end for s in batch for end in s.key_ends()], dtype=torch.int32)
    return starts, seq_lens, key_ends


def test_key_ends_mark_each_soft_token_with_the_end_of_its_block():
    in_block = [t != TEXT for t in CASES["two image blocks, the second a video"].types]
    assert block_key_ends(in_block) == [1, 5, 5, 5, 5, 6, 7, 12, 12, 12, 12, 12, 13]
    assert block_key_ends([True, True, False]) == [2, 2, 3] and block_key_ends([]) == []


@pytest.mark.parametrize("window", WINDOWS)
def test_key_ends_reproduce_transformers_mask(window):
    """Causal-or-same-block within the window is exactly 'k < key_end[q] and k > q - W'."""
    for sequence in BATCH:
        q_pos, k_pos = torch.arange(sequence.length)[:, None], torch.arange(sequence.length)[None, :]
        ends = torch.tensor(block_key_ends([t != TEXT for t in sequence.types]))[:, None]
        ours = (k_pos < ends) & ((k_pos > q_pos - window) if window else True)
        assert torch.equal(ours, transformers_mask(sequence, window))


def random_sequences(batch, heads, kv_heads, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    qs = [torch.randn(s.new, heads, head_dim, generator=gen) for s in batch]
    ks = [torch.randn(s.length, kv_heads, head_dim, generator=gen) for s in batch]
    vs = [torch.randn(s.length, kv_heads, head_dim, generator=gen) for s in batch]
    return qs, ks, vs, gen


def assert_matches_transformers(out, qs, ks, vs, window, scale, starts):
    for b, sequence in enumerate(BATCH):
        visible = transformers_mask(sequence, window)[sequence.cached:]
        want = dense_attention(qs[b], ks[b], vs[b], visible, scale)
        got = out[starts[b]:starts[b + 1]].double()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{list(CASES)[b]}: {m}")


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("return_lse", [False, True])
def test_reference_matches_transformers_mask(window, return_lse):
    qs, ks, vs, gen = random_sequences(BATCH, 4, 2, 32, seed=1)
    k_cache, v_cache, table = paged(ks, vs, 4, 64, gen)
    starts, seq_lens, key_ends = step_lengths(BATCH)
    result = torch_ref.paged_attention(torch.cat(qs), k_cache, v_cache, table, seq_lens, starts, 0.3, window,
                                       return_lse, key_ends=key_ends)
    assert_matches_transformers(result[0] if return_lse else result, qs, ks, vs, window, 0.3, starts)


@pytest.mark.parametrize("window", [3, None])
def test_reference_with_an_fp8_cache_matches_transformers_mask(window):
    """The cache holds K / 0.5 and V / 2 in e4m3: the oracle attends over the values it stands for."""
    qs, ks, vs, gen = random_sequences(BATCH, 4, 2, 32, seed=2)
    scales = (0.5, 2.0)
    stored_k = [to_cache_dtype(k, FP8, scales[0]) for k in ks]
    stored_v = [to_cache_dtype(v, FP8, scales[1]) for v in vs]
    k_cache, v_cache, table = paged([k.float() for k in stored_k], [v.float() for v in stored_v], 4, 64, gen)
    starts, seq_lens, key_ends = step_lengths(BATCH)
    out = torch_ref.paged_attention(torch.cat(qs), k_cache.to(FP8), v_cache.to(FP8), table, seq_lens, starts, 0.3,
                                    window, kv_scales=scales, key_ends=key_ends)
    widened_k = [k.float() * scales[0] for k in stored_k]
    widened_v = [v.float() * scales[1] for v in stored_v]
    assert_matches_transformers(out, qs, widened_k, widened_v, window, 0.3, starts)


@pytest.mark.parametrize("window", [3, None])
def test_reference_on_a_v_only_layer_matches_transformers_mask(window):
    qs, _, vs, gen = random_sequences(BATCH, 4, 2, 64, seed=3)
    rule = key_rule(64, 0.25)
    _, v_cache, table = paged(vs, vs, 4, 64, gen)
    starts, seq_lens, key_ends = step_lengths(BATCH)
    out = torch_ref.paged_attention(torch.cat(qs), None, v_cache, table, seq_lens, starts, 0.125, window,
                                    k_from_v=rule, key_ends=key_ends)
    ks = [keys_from_values(v, torch.arange(v.shape[0]), rule) for v in vs]
    assert_matches_transformers(out, qs, ks, vs, window, 0.125, starts)


def test_reference_refuses_key_ends_before_the_query_or_past_the_cache():
    qs, ks, vs, gen = random_sequences(BATCH[:1], 2, 1, 16, seed=4)
    k_cache, v_cache, table = paged(ks, vs, 4, 16, gen)
    starts, seq_lens, key_ends = step_lengths(BATCH[:1])
    for bad, value in ((4, 4), (0, 13)):  # query 4 would not see itself; 13 keys are past the 12 cached
        wrong = key_ends.clone()
        wrong[bad] = value
        with pytest.raises(ValueError, match="must lie in"):
            torch_ref.paged_attention(torch.cat(qs), k_cache, v_cache, table, seq_lens, starts, 0.3, None,
                                      key_ends=wrong)


def image_batch(heads, kv_heads, head_dim, block_size, dtype, window, seed):
    """paged_batch over BATCH (NaN in every slot no query may read) and the step's key ends, on DEVICE."""
    args = paged_batch([s.new for s in BATCH], [s.length for s in BATCH], heads, kv_heads, head_dim, block_size,
                       dtype, window, DEVICE, seed)
    return args, step_lengths(BATCH)[2].to(DEVICE)


@pytest.mark.parametrize("head_dim,heads,kv_heads,block_size,window,dtype", [
    (64, 4, 2, 4, 3, torch.float32),
    (64, 4, 2, 4, 8, torch.float32),
    (64, 4, 2, 16, None, torch.float32),
    (64, 8, 1, 4, 8, torch.bfloat16),
    (256, 2, 1, 16, 5, torch.float32),  # the sliding layers' head_dim
])
def test_triton_matches_reference(head_dim, heads, kv_heads, block_size, window, dtype):
    args, key_ends = image_batch(heads, kv_heads, head_dim, block_size, dtype, window, seed=head_dim + heads)
    out, lse = tri.paged_attention(*args, 0.3, window, True, key_ends=key_ends)
    assert_close_to_reference(out, lse, args, 0.3, window, key_ends=key_ends)


@pytest.mark.parametrize("window", [3, None])
@pytest.mark.parametrize("splits", [1, 3])
def test_triton_small_tiles_and_split_kv_match_reference(window, splits):
    """4 queries and 16 keys a tile: key ends fall inside tiles, and one tile's queries end in different tiles."""
    args, key_ends = image_batch(4, 2, 64, 4, torch.float32, window, seed=splits)
    config = tri.AttnConfig(block_m=8, block_n=16, num_warps=4, num_stages=1, num_splits=splits)
    out, lse = tri.launch(*args, 2.0, window, True, config, key_ends=key_ends)  # a large scale: row maxima jump
    assert_close_to_reference(out, lse, args, 2.0, window, key_ends=key_ends)


@pytest.mark.parametrize("window", [8, None])
def test_triton_reads_an_fp8_cache_with_key_ends_like_the_reference(window):
    (q, k_cache, v_cache, *rest), key_ends = image_batch(4, 2, 64, 4, torch.float32, window, seed=5)
    scales = (0.5, 2.0)
    args = (q, to_cache_dtype(k_cache, FP8, scales[0]), to_cache_dtype(v_cache, FP8, scales[1]), *rest)
    out = tri.paged_attention(*args, 0.125, window, kv_scales=scales, key_ends=key_ends)
    ref = torch_ref.paged_attention(*args, 0.125, window, kv_scales=scales, key_ends=key_ends)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("window,host_lengths", [(8, False), (None, False), (None, True)])
def test_triton_v_only_layer_with_key_ends_matches_reference(window, host_lengths, monkeypatch):
    """Keys rebuilt from V in the kernel, or built once for the step (lengths on the host, no window)."""
    (q, _, v_cache, table, seq_lens, starts), key_ends = image_batch(8, 1, 64, 4, torch.float32, window, seed=6)
    rule = key_rule(64, 0.25, DEVICE)
    host = HostBatch.of(starts.tolist(), seq_lens.tolist()) if host_lengths else None
    builds, build_keys = [], tri.build_keys
    monkeypatch.setattr(tri, "build_keys", lambda *a, **kw: (builds.append(1), build_keys(*a, **kw))[1])
    out = tri.paged_attention(q, None, v_cache, table, seq_lens, starts, 0.125, window, True, k_from_v=rule,
                              host=host, key_ends=key_ends)
    assert len(builds) == host_lengths
    assert_close_to_reference(*out, (q, None, v_cache, table, seq_lens, starts), 0.125, window, k_from_v=rule,
                              key_ends=key_ends)


@pytest.mark.parametrize("window", [3, None])
def test_causal_key_ends_give_the_text_only_outputs_bit_for_bit(window):
    """key_ends of position + 1 are the causal mask: the key-ends path and the text-only path agree to the bit, in
    the reference and in the kernel."""
    args, _ = image_batch(4, 2, 64, 4, torch.float32, window, seed=7)
    starts, seq_lens = args[5].tolist(), args[4].tolist()
    causal = torch.tensor([pos + 1 for b, n in enumerate(seq_lens)
                           for pos in range(n - (starts[b + 1] - starts[b]), n)], dtype=torch.int32, device=DEVICE)
    for op in (torch_ref.paged_attention, tri.paged_attention):
        plain_out, plain_lse = op(*args, 0.3, window, True)
        out, lse = op(*args, 0.3, window, True, key_ends=causal)
        assert torch.equal(out, plain_out) and torch.equal(lse, plain_lse)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_only_layers_built_with_bidirectional_spans_read_key_ends(bidirectional, backend):
    (q, k_cache, v_cache, table, seq_lens, starts), key_ends = image_batch(4, 2, 64, 4, torch.float32, 8, seed=8)
    with dispatch.use(Platform(), backend):
        layer = Attention(4, 2, 64, 0.3, 8, bidirectional_spans=bidirectional)
    layer.bind_cache(k_cache, v_cache, group_id=0)
    positions = torch.cat([torch.arange(n - (starts[b + 1] - starts[b]), n)
                           for b, n in enumerate(seq_lens.tolist())]).to(DEVICE)
    ctx = ForwardContext(positions, starts, seq_lens, {0: GroupBatch(torch.full_like(positions, -1), table)},
                         key_ends=key_ends)
    out = layer(q, None, None, ctx)
    expected = torch_ref.paged_attention(q, k_cache, v_cache, table, seq_lens, starts, 0.3, 8,
                                         key_ends=key_ends if bidirectional else None)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    causal = torch_ref.paged_attention(q, k_cache, v_cache, table, seq_lens, starts, 0.3, 8)
    assert ((out - causal).abs().max() > 0.1) == bidirectional  # the image blocks change the outputs
