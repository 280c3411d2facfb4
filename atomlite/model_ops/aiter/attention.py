"""atomlite's one attention op (prefill and decode over the paged cache) and KV write, on AITER.

Routing per batch: a decode-only batch (every sequence adds one query; HostBatch.decode_only, or T == B without it)
with no LSE asked for -> paged_attention_v1 over the NHD cache. Anything else -> flash_attn_varlen_func on K/V
gathered from the paged cache; the gather copies only the keys a query can see (the window is applied there too),
and its indices are planned once per step and KV group (gather.py). flash_attn_varlen_func's own block_table path
is not used: it needs page sizes that are a multiple of 128, and atomlite's blocks are 16 by default.
A step with key_ends (image blocks that attend both ways) is not AITER's: see _attention_over_spans.
"""
import logging
import math
from collections.abc import Callable
from functools import cache

import torch

from atomlite.model_ops import dispatch, torch_ref
from atomlite.model_ops.aiter import detect, functions as F, gather
from atomlite.model_ops.aiter.gather import GatherPlan
from atomlite.model_ops.context import HostBatch
from atomlite.model_ops.kv_spec import UNIT_SCALES, cache_scales
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.platform import Platform

logger = logging.getLogger("atomlite.aiter")

HALF_DTYPES = (torch.bfloat16, torch.float16)
PARTITION_SIZE = 256


@cache
def scale_tensor(value: float, device: torch.device) -> torch.Tensor:
    """k_scale / v_scale as the kernels take them (a bf16 cache ignores them): one tensor per value, made at the first
    (eager) step and reused, so graph capture never copies a scale from the host."""
    return torch.full((1,), value, dtype=torch.float32, device=device)


def cache_dtype_name(cache: torch.Tensor) -> str:
    """AITER's kv_cache_dtype for a cache: "fp8" (aiter.dtypes.fp8, the platform's e4m3) or "auto"."""
    return "fp8" if cache.element_size() == 1 else "auto"


def _reads_cache(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """paged_attention_v1 reads a cache of q's dtype ("auto") or fp8; a 16-bit cache of the other 16-bit dtype
    (e.g. --dtype bfloat16 --kv-cache-dtype float16) would be read as q's: the reference serves that instead."""
    return cache.element_size() == 1 or cache.dtype == q.dtype


def flash_window(window: int | None) -> tuple[int, int]:
    """HF window W (key visible iff 0 <= qpos - kpos < W) -> flash-attn (left, right) = (W - 1, 0)."""
    return (-1, -1) if window is None else (window - 1, 0)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    window: int | None = None, return_lse: bool = False, host: HostBatch | None = None,
                    derived: object | None = None, kv_scales: tuple[float, float] = UNIT_SCALES,
                    key_ends: torch.Tensor | None = None):
    """torch_ref.paged_attention's contract on AITER kernels. Lengths come from `host`; without it, a prefill reads
    them back from the device. derived: the step's gather plan for this KV group (gather.step_plan), else it is
    planned here. key_ends: the step goes to another backend (_attention_over_spans)."""
    if key_ends is not None:
        attend = _attention_over_spans(q.shape[2], q.shape[1] // v_cache.shape[2], window is not None)
        return attend(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, window, return_lse,
                      host=host, kv_scales=kv_scales, key_ends=key_ends)
    if q.dtype not in HALF_DTYPES or not _reads_cache(q, k_cache):
        return torch_ref.paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                                         window, return_lse, kv_scales=kv_scales)
    kv_scales = cache_scales(k_cache, kv_scales)
    q = q.contiguous()  # the kernels take one row stride and assume packed heads
    decode_only = host.decode_only if host is not None else q.shape[0] == seq_lens.shape[0]
    if decode_only and not return_lse:
        return _decode(q, k_cache, v_cache, block_table, seq_lens, scale, window, host, kv_scales)
    host = host or HostBatch.of(query_start_loc.tolist(), seq_lens.tolist())
    planned = isinstance(derived, GatherPlan) and derived.window == window
    plan = derived if planned else gather.plan_gather(host, seq_lens, block_table, k_cache.shape[1], window)
    # flash_attn_varlen_func takes bf16/fp16: an fp8 cache's keys are widened as they are gathered; K's scale
    # multiplies the softmax scale and V's the output (1 for a 16-bit cache)
    k, v = plan.gather(k_cache).to(q.dtype), plan.gather(v_cache).to(q.dtype)
    k_scale, v_scale = kv_scales
    result = _prefill(q, k, v, plan, query_start_loc, host.max_query_len, scale * k_scale, window, return_lse)
    if v_scale == 1.0:
        return result
    return (result[0] * v_scale, result[1]) if return_lse else result * v_scale


paged_attention.step_metadata = gather.step_plan


@cache
def _attention_over_spans(head_dim: int, gqa: int, window: bool) -> Callable:
    """The kernel for steps with key_ends. flash_attn_varlen_func masks causally (and by a window) only, never by each
    query's own key end, and paged_attention_v1 serves decode alone: such a step (an image in a prefill, on the
    layers whose image blocks attend both ways) runs on Triton's kernel, which every ROCm GPU with AITER has, or on
    the reference where Triton does not take the shape. Said once per shape in the log."""
    platform = detect.local_platform() or Platform()
    choice = dispatch.choose("attention", platform, "triton", head_dim=head_dim, gqa=gqa, window=window)
    logger.info("attention[head_dim=%d, gqa=%d, window=%s] with per-query key ends (image blocks that attend both "
                "ways): AITER's flash attention masks causally only, so %s serves these steps (%s)",
                head_dim, gqa, window, choice.backend, choice.reason)
    return choice.fn


def decode_workspace_bytes(num_seqs: int, num_heads: int, head_dim: int, elem_size: int, max_len: int,
                           partition: int) -> int:
    """paged_attention_v1's scratch: partial outputs plus fp32 max-logit and exp-sum per partition."""
    parts = math.ceil(max_len / partition)
    return num_seqs * num_heads * parts * (head_dim * elem_size + 2 * 4)


def _decode(q, k_cache, v_cache, block_table, seq_lens, scale, window, host: HostBatch | None,
            kv_scales: tuple[float, float]):
    num_seqs, num_heads, head_dim = q.shape
    # The table's capacity bounds every context without reading seq_lens back (graph capture stays possible).
    max_len = block_table.shape[1] * k_cache.shape[1]
    if host is not None:
        max_len = min(max_len, host.max_seq_len)
    partition = max(PARTITION_SIZE, k_cache.shape[1])
    workspace = torch.empty(decode_workspace_bytes(num_seqs, num_heads, head_dim, q.element_size(), max_len,
                                                   partition), dtype=torch.uint8, device=q.device)
    out = torch.empty_like(q)
    k_scale, v_scale = (scale_tensor(s, q.device) for s in kv_scales)
    detect.call(F.PAGED_DECODE, out=out, workspace_buffer=workspace, query=q, key_cache=k_cache,
                value_cache=v_cache, scale=scale, block_tables=block_table, cu_query_lens=None,
                context_lens=seq_lens, max_context_len=max_len, alibi_slopes=None,
                kv_cache_dtype=cache_dtype_name(k_cache),
                kv_cache_layout="NHD", logits_soft_cap=0.0, k_scale=k_scale, v_scale=v_scale, partition_size=partition,
                sliding_window=window or 0)
    return out


def _prefill(q, k, v, plan: GatherPlan, query_start_loc, max_query_len: int, scale, window, return_lse):
    result = detect.call(F.FLASH_VARLEN, q=q, k=k, v=v, cu_seqlens_q=query_start_loc, cu_seqlens_k=plan.cu_seqlens_k,
                         max_seqlen_q=max_query_len, max_seqlen_k=plan.max_seqlen_k, softmax_scale=scale,
                         causal=True, window_size=flash_window(window), return_lse=return_lse)
    if not return_lse:
        return result
    out, lse = result
    return out, lse.transpose(0, 1).contiguous()  # AITER's LSE is [Hq, T]; atomlite's is [T, Hq]


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: tuple[float, float] = UNIT_SCALES) -> None:
    """torch_ref.write_kv's contract on reshape_and_cache_flash (NHD cache; slots < 0 are skipped). An fp8 cache
    takes bf16/fp16 rows and quantizes them itself, dividing by its scales."""
    fp8 = cache_dtype_name(k_cache) == "fp8"
    if not fp8:
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_scale, v_scale = (scale_tensor(s, k.device) for s in cache_scales(k_cache, kv_scales))
    detect.call(F.WRITE_KV_NHD, key=k.contiguous(), value=v.contiguous(), key_cache=k_cache, value_cache=v_cache,
                slot_mapping=slot_mapping, kv_cache_dtype=cache_dtype_name(k_cache), k_scale=k_scale, v_scale=v_scale)


CK_MAX_HEAD_DIM = 256


def ck_head_dim_refusal(head_dim: int | None) -> str | None:
    """Which head dims CK's flash attention takes (prefill, and the encoder's)."""
    if head_dim is None:
        return None
    if head_dim > CK_MAX_HEAD_DIM:
        return f"CK flash attention stops at head_dim {CK_MAX_HEAD_DIM} (got {head_dim})"
    if head_dim % 8:
        return f"CK flash attention needs head_dim divisible by 8 (got {head_dim})"
    return None


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("k_from_v"):
        return "AITER's attention reads a K cache; keys derived from V run on Triton"
    return ck_head_dim_refusal(shape.get("head_dim"))


declare("attention", "aiter", paged_attention, refuses=_refuses, requires=(F.FLASH_VARLEN, F.PAGED_DECODE))
declare("write_kv", "aiter", write_kv, requires=(F.WRITE_KV_NHD,))
