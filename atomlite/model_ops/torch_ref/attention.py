"""Reference attention: causal (aligned bottom-right), optional sliding window, GQA, any head_dim, optional LSE.

Query i of a sequence with Lq queries and Lk keys sits at position Lk - Lq + i, so a chunk that follows cached
tokens (a prefix hit or a later prefill chunk) still sees every earlier key. With key_ends, a query sees the keys
before its own key end instead of those up to its position (image blocks that attend both ways); the window still
counts back from its position.

Sequences with the same number of queries attend as one batch (a decode step's all together): their cached keys are
gathered and padded to the longest, and the padding is masked out like any key a query may not see.
"""
import torch
import torch.nn.functional as F

from atomlite.model_ops.context import HostBatch
from atomlite.model_ops.k_from_v import KFromV
from atomlite.model_ops.kv_spec import UNIT_SCALES
from atomlite.model_ops.torch_ref.rope import apply_rope
from atomlite.model_ops.kernels import declare


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            visible: torch.Tensor, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [B, Lq, Hq, D], k/v [B, Lk, Hkv, D], visible [B, Lq, Lk] -> out [B, Lq, Hq, D], lse [B, Lq, Hq]."""
    group = q.shape[2] // k.shape[2]
    if not return_lse:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=visible[:, None], scale=scale, enable_gqa=group > 1)
        return out.transpose(1, 2), None
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(scores - lse[..., None]), vf)
    return out.to(q.dtype), lse.transpose(1, 2)


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
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    for num_q, seqs in _by_query_count(query_start_loc.tolist()).items():
        seqs = torch.tensor(seqs, device=q.device)
        rows = query_start_loc[seqs].long()[:, None] + torch.arange(num_q, device=q.device)  # [B, Lq]
        num_k = seq_lens[seqs].long()
        q_pos = num_k[:, None] - num_q + torch.arange(num_q, device=q.device)
        ends = q_pos + 1 if key_ends is None else _checked_key_ends(key_ends[rows], q_pos, num_k)
        k, v, k_pos = _cached_keys(k_cache, v_cache, block_table[seqs], num_k, num_q, window, kv_scales, k_from_v,
                                   q.dtype)
        visible = k_pos[:, None, :] < ends[:, :, None]
        if window is not None:
            visible &= k_pos[:, None, :] > q_pos[:, :, None] - window
        o, l = _attend(q[rows], k, v, scale, visible, return_lse)
        out[rows] = o
        if return_lse:
            lse[rows] = l
    return (out, lse) if return_lse else out


def _by_query_count(starts: list[int]) -> dict[int, list[int]]:
    """The sequences (their indices) by how many queries each has this step; those with none are left out."""
    groups = {}
    for b, (start, end) in enumerate(zip(starts, starts[1:])):
        if end > start:
            groups.setdefault(end - start, []).append(b)
    return groups


def _cached_keys(k_cache: torch.Tensor | None, v_cache: torch.Tensor, block_table: torch.Tensor,
                 num_k: torch.Tensor, num_q: int, window: int | None, kv_scales: tuple[float, float],
                 k_from_v: KFromV | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sequence's keys and values in dtype from the first one its queries may see, padded to the longest by
    repeating its last (finite, and masked out by position) -> k, v [B, Lk, Hkv, D] and each key's position [B, Lk]
    (padding lies at or past num_k). block_table [B, max_blocks], num_k [B]: the sequences' rows and key counts."""
    k_scale, v_scale = kv_scales
    block_size = v_cache.shape[1]
    first = torch.zeros_like(num_k) if window is None else (num_k - num_q - window + 1).clamp(min=0)
    k_pos = first[:, None] + torch.arange(int((num_k - first).max()), device=num_k.device)
    read = torch.minimum(k_pos, num_k[:, None] - 1)
    blocks, offsets = block_table.gather(1, read // block_size).long(), read % block_size
    v = _widen(v_cache[blocks, offsets], v_scale)
    if k_from_v is None:  # an fp8 cache computes in q's dtype
        k = _widen(k_cache[blocks, offsets], k_scale).to(dtype)
    else:
        k = keys_from_values(v.flatten(0, 1), read.flatten(), k_from_v, dtype).view_as(v)
    return k, v.to(dtype), k_pos


def _checked_key_ends(key_ends: torch.Tensor, q_pos: torch.Tensor, num_k: torch.Tensor) -> torch.Tensor:
    """The sequences' key ends [B, Lq], which must lie in [position + 1, seq_len]: a query sees at least its own key
    and no key the cache does not hold yet."""
    key_ends = key_ends.to(device=q_pos.device, dtype=torch.int64)
    wrong = (key_ends <= q_pos) | (key_ends > num_k[:, None])
    if bool(wrong.any()):
        b = int(wrong.any(dim=1).nonzero()[0])
        raise ValueError(f"key_ends {key_ends[b].tolist()} must lie in [position + 1, {int(num_k[b])}] for queries "
                         f"at positions {q_pos[b].tolist()}: a query sees at least itself and only keys in the cache")
    return key_ends


declare("attention", "torch", paged_attention,
        graph_unsafe="groups the sequences by their query counts, which it reads back to the host (.tolist())")
