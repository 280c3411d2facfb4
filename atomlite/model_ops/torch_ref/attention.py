"""Reference attention: causal (aligned bottom-right), optional sliding window, GQA, any head_dim, optional LSE.

Query i of a sequence with Lq queries and Lk keys sits at position Lk - Lq + i, so a chunk that follows cached
tokens (a prefix hit or a later prefill chunk) still sees every earlier key. With key_ends, a query sees the keys
before its own key end instead of those up to its position (image blocks that attend both ways); the window still
counts back from its position.
"""
import torch
import torch.nn.functional as F

from atomlite.model_ops.context import HostBatch
from atomlite.model_ops.k_from_v import KFromV
from atomlite.model_ops.kv_spec import UNIT_SCALES
from atomlite.model_ops.torch_ref.rope import apply_rope
from atomlite.model_ops.kernels import declare


def _mask(q_pos: torch.Tensor, key_ends: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[Lq, Lk]: key k is visible to query q iff k < key_end[q] and, with a window W, k > q - W."""
    visible = k_pos[None, :] < key_ends[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    return visible


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None,
            return_lse: bool, q_pos: torch.Tensor, key_ends: torch.Tensor,
            k_offset: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [Lq, Hq, D] at positions q_pos [Lq], k/v [Lk, Hkv, D] -> out [Lq, Hq, D], lse [Lq, Hq].
    k_offset: keys dropped before k[0]."""
    num_heads = q.shape[1]
    k_pos = torch.arange(k_offset, k_offset + k.shape[0], device=q.device)
    visible = _mask(q_pos, key_ends, k_pos, window)
    group = num_heads // k.shape[1]
    if not return_lse:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=visible, scale=scale, enable_gqa=group > 1)
        return out[0].transpose(0, 1), None
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", torch.exp(scores - lse[..., None]), vf)
    return out.to(q.dtype), lse.transpose(0, 1).contiguous()


def keys_from_values(v: torch.Tensor, positions: torch.Tensor, k_from_v: KFromV,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    """v [Lk, Hkv, D] at positions [Lk] -> K = rope(v * weight), in fp32 and rounded once to dtype (v's)."""
    x = v.float() * k_from_v.weight.float()
    return apply_rope(x, k_from_v.cos[positions], k_from_v.sin[positions]).to(dtype or v.dtype)


def _widen(cached: torch.Tensor, scale: float) -> torch.Tensor:
    """Cache rows as the values they stand for: an fp8 cache's times its scale (in fp32)."""
    return cached.float() * scale if cached.element_size() == 1 and scale != 1.0 else cached


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    window: int | None = None, return_lse: bool = False, k_from_v: KFromV | None = None,
                    host: HostBatch | None = None, derived: object | None = None,
                    kv_scales: tuple[float, float] = UNIT_SCALES, key_ends: torch.Tensor | None = None):
    """Attention over a paged cache, prefill and decode alike.

    q [T, Hq, D]; caches [num_blocks, block_size, Hkv, D]; block_table [B, max_blocks] (physical block of each
    logical block); seq_lens [B] keys per sequence including this step's queries; query_start_loc [B+1].
    With k_from_v there is no K cache (k_cache is ignored): keys are rebuilt from the values.
    host: the same lengths on the host, when the caller has them; derived: what a backend's step_metadata built from
    this step's batch for this KV group (GroupBatch.derived). The reference needs neither: it reads the lengths
    back from the device (so a CUDA/HIP graph cannot capture it; its declaration says so, graph_unsafe).
    kv_scales: (K, V) scales of an fp8 cache, which holds K / k_scale and V / v_scale (write_kv's).
    key_ends: [T] int, each query's exclusive end of visible keys (ForwardContext.key_ends); None: position + 1.
    """
    k_scale, v_scale = kv_scales
    block_size = v_cache.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, num_k in enumerate(lens):
        q_b = q[starts[b]:starts[b + 1]]
        if q_b.shape[0] == 0:
            continue
        q_pos = torch.arange(num_k - q_b.shape[0], num_k, device=q.device)
        ends = q_pos + 1 if key_ends is None else _checked_key_ends(key_ends[starts[b]:starts[b + 1]], q_pos, num_k)
        first_needed = 0 if window is None else max(0, num_k - q_b.shape[0] - window + 1)
        first_block = first_needed // block_size
        blocks = block_table[b, first_block:(num_k + block_size - 1) // block_size].long()
        k_offset = first_block * block_size
        v_b = _widen(v_cache[blocks].flatten(0, 1)[:num_k - k_offset], v_scale)
        if k_from_v is None:  # an fp8 cache computes in q's dtype
            k_b = _widen(k_cache[blocks].flatten(0, 1)[:num_k - k_offset], k_scale).to(q.dtype)
        else:
            k_b = keys_from_values(v_b, torch.arange(k_offset, num_k, device=q.device), k_from_v, q.dtype)
        v_b = v_b.to(q.dtype)
        o, l = _attend(q_b, k_b, v_b, scale, window, return_lse, q_pos, ends, k_offset)
        out[starts[b]:starts[b + 1]] = o
        if return_lse:
            lse[starts[b]:starts[b + 1]] = l
    return (out, lse) if return_lse else out


def _checked_key_ends(key_ends: torch.Tensor, q_pos: torch.Tensor, num_k: int) -> torch.Tensor:
    """One sequence's key ends, which must lie in [position + 1, seq_len]: a query sees at least its own key and
    no key the cache does not hold yet."""
    key_ends = key_ends.to(device=q_pos.device, dtype=torch.int64)
    if bool(((key_ends <= q_pos) | (key_ends > num_k)).any()):
        raise ValueError(f"key_ends {key_ends.tolist()} must lie in [position + 1, {num_k}] for queries at "
                         f"positions {q_pos.tolist()}: a query sees at least itself and only keys in the cache")
    return key_ends


declare("attention", "torch", paged_attention,
        graph_unsafe="loops over the sequences, whose lengths it reads back to the host (.tolist())")
