"""atomlite's Attention layer (KV write + paged attention through dispatch) on vLLM's per-layer KV cache views,
as the vLLM backend runs it, equals the torch reference on atomlite's own contiguous cache: every KVCacheLayout
stride order, torch and Triton kernels (CPU: interpreter; GPU: compiled). No vLLM needed: the layouts are
rebuilt here from vLLM 0.32's stride orders over the logical [layer, block, kv head, slot, K|V channel] axes."""
import pytest
import torch

from atomlite.model_ops import dispatch
from atomlite.model_ops.attention import Attention
from atomlite.model_ops.context import ForwardContext, GroupBatch
from atomlite.model_ops.platform import detect_platform
from atomlite.plugin.vllm.kv_layout import split_kv_cache

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LAYOUTS = {"LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "LHBNC": (0, 2, 1, 3, 4),
           "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4)}
BLOCK = 16
# (cached tokens before the step, new tokens in the step) per sequence: a prefill, a decode, a later chunk
SEQS = [(0, 13), (21, 1), (9, 7)]


def vllm_layer_view(layout: str, num_blocks: int, heads: int, head_dim: int, dtype) -> torch.Tensor:
    """Layer 1 of a 2-layer cache allocated in `layout`'s physical order: [blocks, heads, slots, 2 * head_dim]."""
    logical = (2, num_blocks, heads, BLOCK, 2 * head_dim)
    order = LAYOUTS[layout]
    physical = torch.full([logical[i] for i in order], float("nan"), dtype=dtype, device=DEVICE)
    return physical.permute([order.index(i) for i in range(5)])[1]


def step(heads: int, kv_heads: int, head_dim: int, dtype, new: bool, gen: torch.Generator):
    """q, k, v and context of one step. new=False writes the cached tokens only (no queries)."""
    spans = [(cached, cached + n) if new else (0, cached) for cached, n in SEQS]
    lens = [end - start for start, end in spans]
    q_lens = lens if new else [0] * len(SEQS)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(sum(lens), kv_heads, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(2))
    table = torch.arange(1, 1 + 3 * len(SEQS)).flip(0).view(len(SEQS), 3).to(torch.int32)  # block 0 = null
    pos = torch.cat([torch.arange(start, end) for start, end in spans])
    seq = torch.repeat_interleave(torch.arange(len(SEQS)), torch.tensor(lens))
    slots = table[seq, pos // BLOCK].long() * BLOCK + pos % BLOCK
    i32 = {"dtype": torch.int32, "device": DEVICE}
    ctx = ForwardContext(pos.to(DEVICE), torch.tensor([0] + q_lens, **i32).cumsum(0, dtype=torch.int32),
                         torch.tensor([end for _, end in spans], **i32),
                         {0: GroupBatch(slots.to(DEVICE), table.to(DEVICE))})
    return q, k, v, ctx


def run_layer(prefer: str, k_cache, v_cache, steps, heads, kv_heads, head_dim, window):
    with dispatch.use(detect_platform(DEVICE), prefer):
        attn = Attention(heads, kv_heads, head_dim, head_dim ** -0.5, window)
    assert attn._attend.__module__.startswith(f"atomlite.model_ops.{'triton' if prefer == 'triton' else 'torch_ref'}")
    attn.bind_cache(k_cache, v_cache, 0)
    return [attn(*step) for step in steps][-1]


def check(layout: str, prefer: str, heads: int, kv_heads: int, head_dim: int, window, dtype):
    gen = torch.Generator().manual_seed(head_dim + heads)
    steps = [step(heads, kv_heads, head_dim, dtype, new, gen) for new in (False, True)]
    num_blocks = 1 + 3 * len(SEQS)
    kv = vllm_layer_view(layout, num_blocks, kv_heads, head_dim, dtype)
    out = run_layer(prefer, *split_kv_cache(kv, head_dim), steps, heads, kv_heads, head_dim, window)
    ref_k, ref_v = (torch.full((num_blocks, BLOCK, kv_heads, head_dim), float("nan"), dtype=torch.float32,
                               device=DEVICE) for _ in range(2))
    upcast = [tuple(t.float() if torch.is_tensor(t) else t for t in s) for s in steps]
    expected = run_layer("torch", ref_k, ref_v, upcast, heads, kv_heads, head_dim, window)
    k_view, v_view = split_kv_cache(kv, head_dim)
    assert torch.equal(k_view.float().nan_to_num(7.0), ref_k.to(dtype).float().nan_to_num(7.0))  # written in place
    assert torch.equal(v_view.float().nan_to_num(7.0), ref_v.to(dtype).float().nan_to_num(7.0))
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("prefer", ["torch", "triton"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_attention_on_every_vllm_layout_matches_reference(layout, prefer):
    check(layout, prefer, heads=4, kv_heads=2, head_dim=64, window=8, dtype=torch.float32)


@pytest.mark.parametrize("prefer", ["torch", "triton"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,dtype", [
    (8, 2, 256, 8, torch.bfloat16),  # Gemma 4 sliding layers: 256-dim heads, window shorter than the prompts
    (8, 1, 512, None, torch.bfloat16),  # Gemma 4 global layers: 512-dim heads, GQA 8
    (4, 4, 128, 5, torch.float16),
])
def test_gemma4_head_shapes_on_vllm_layout_match_reference(heads, kv_heads, head_dim, window, dtype, prefer):
    check("LBNHC", prefer, heads, kv_heads, head_dim, window, dtype)
