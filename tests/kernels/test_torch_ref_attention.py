"""The reference attention itself: paged vs dense math, bottom-right causal alignment, windows, GQA, LSE."""
import math

import pytest
import torch

from atomlite.model_ops.torch_ref import paged_attention


def dense_reference(q, k, v, window, scale):
    """float64 softmax attention of one sequence with explicit positions: query i at Lk - Lq + i."""
    lq, lk, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    qpos = torch.arange(lk - lq, lk)[:, None]
    kpos = torch.arange(lk)[None]
    visible = (kpos <= qpos) & ((qpos - kpos < window) if window else True)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vv), lse.T


def paged(keys, values, block_size, num_blocks, gen):
    """Scatter per-sequence K/V into a shuffled paged cache; block 0 stays the (zero) null block."""
    heads, dim = keys[0].shape[1:]
    k_cache = torch.zeros(num_blocks, block_size, heads, dim)
    v_cache = torch.zeros_like(k_cache)
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    width = max(math.ceil(k.shape[0] / block_size) for k in keys)
    table = torch.zeros(len(keys), width, dtype=torch.int32)
    for b, (k, v) in enumerate(zip(keys, values)):
        for j in range(math.ceil(k.shape[0] / block_size)):
            blk = free.pop()
            table[b, j] = blk
            part = slice(j * block_size, (j + 1) * block_size)
            k_cache[blk, :k[part].shape[0]] = k[part]
            v_cache[blk, :v[part].shape[0]] = v[part]
    return k_cache, v_cache, table


@pytest.mark.parametrize("head_dim,heads,kv_heads,window,block_size", [
    (64, 4, 4, None, 16), (256, 4, 2, 5, 16), (512, 8, 1, None, 32), (32, 4, 2, 40, 4)])
@pytest.mark.parametrize("return_lse", [False, True])
def test_paged_attention_matches_dense_math(head_dim, heads, kv_heads, window, block_size, return_lse):
    gen = torch.Generator().manual_seed(head_dim + heads)
    lens = [(1, 1), (7, 7), (3, 20), (1, 33), (0, 9), (12, 40)]  # (queries, keys): prefill, decode, prefix hits
    qs = [torch.randn(lq, heads, head_dim, generator=gen) for lq, _ in lens]
    ks = [torch.randn(lk, kv_heads, head_dim, generator=gen) for _, lk in lens]
    vs = [torch.randn(lk, kv_heads, head_dim, generator=gen) for _, lk in lens]
    k_cache, v_cache, table = paged(ks, vs, block_size, 64, gen)
    starts = torch.tensor([0] + [sum(lq for lq, _ in lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    seq_lens = torch.tensor([lk for _, lk in lens], dtype=torch.int32)
    scale = head_dim ** -0.5
    result = paged_attention(torch.cat(qs), k_cache, v_cache, table, seq_lens, starts, scale, window, return_lse)
    out, lse = result if return_lse else (result, None)
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        if q.shape[0] == 0:
            continue
        want, want_lse = dense_reference(q, k, v, window, scale)
        got = out[starts[b]:starts[b + 1]]
        assert torch.allclose(got.double(), want, atol=1e-5), (b, (got.double() - want).abs().max())
        if return_lse:
            assert torch.allclose(lse[starts[b]:starts[b + 1]].double(), want_lse, atol=1e-5)
