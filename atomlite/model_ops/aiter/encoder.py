"""encoder_attention (a vision tower's packed images, bidirectional) on AITER's flash_attn_varlen_func.

Why it fits (read at ROCm/aiter e4048607): causal=False with cu_seqlens_q = cu_seqlens_k is attention within each
packed sequence. On gfx942/gfx950 a head_dim other than 128 (or 192 with 128-wide values) passes the ASM fmha v3
path by (ops/mha.py:2835-2859, _flash_attn_varlen_forward) and reaches CK's group-mode fmha forward, mha_varlen_fwd,
which takes bf16/fp16 with head_dim <= 256 and a multiple of 8 (csrc/py_itfs_ck/mha_varlen_fwd_kernels.cu:392,
474-477). Its kernels are generated with receipt 600 (aiter/jit/optCompilerConfig.json, module_mha_varlen_fwd),
which keeps every fp16/bf16 head-dim tile of gfx9 and gfx950: 64 has its own, 72 runs in a wider tile with the head
dim padded (CK's example/ck_tile/01_fmha/codegen/ops/fmha_fwd.py, the dpad pipelines). AITER's own test covers
non-causal varlen at head dims 59, 64, 96 and 111 (op_tests/test_mha_varlen.py:390-404). float32 is not taken:
that falls to Triton (limits()), and so does a call in a dtype the layer was not built for.
"""
from collections.abc import Callable
from functools import cache

import torch

from atomlite.model_ops import dispatch
from atomlite.model_ops.aiter import detect, functions as F
from atomlite.model_ops.aiter.attention import HALF_DTYPES, ck_head_dim_refusal, flash_window
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.platform import Platform


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedSequences,
                      scale: float) -> torch.Tensor:
    """torch_ref.encoder_attention's contract; the longest sequence comes from the host's lengths (no sync)."""
    if q.dtype not in HALF_DTYPES:
        return _other_dtype(q.shape[2], q.shape[1] // k.shape[1])(q, k, v, packed, scale)
    if q.shape[0] == 0 or not packed.lengths:
        return torch.empty_like(q)
    longest = packed.max_length
    return detect.call(F.FLASH_VARLEN, q=q, k=k, v=v, cu_seqlens_q=packed.cu_seqlens, cu_seqlens_k=packed.cu_seqlens,
                       max_seqlen_q=longest, max_seqlen_k=longest, softmax_scale=scale, causal=False,
                       window_size=flash_window(None))


@cache
def _other_dtype(head_dim: int, gqa: int) -> Callable:
    """Where a float32 pack reaches the adapter: Triton's kernel (the reference where Triton refuses the shape)."""
    platform = detect.local_platform() or Platform()
    return dispatch.choose("encoder_attention", platform, "triton", head_dim=head_dim, gqa=gqa,
                           dtype=torch.float32).fn


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("dtype", torch.bfloat16) not in HALF_DTYPES:
        return f"CK's flash attention forward takes bfloat16 or float16, not {shape['dtype']}"
    return ck_head_dim_refusal(shape.get("head_dim"))


# flash_attn_varlen_func, not causal (CK's group-mode fmha forward)
declare("encoder_attention", "aiter", encoder_attention, refuses=_refuses, requires=(F.FLASH_VARLEN,))
