"""What each AITER function computes, written in torch from AITER's own documentation and kernels (ops/mha.py
docstrings, csrc/cpp_itfs/pa/pa_kernels.cuh, csrc/kernels/cache_kernels.cu, ops/rmsnorm.py, ops/gemm_op_a4w4.py,
dist/device_communicators/custom_all_reduce.py).
test_aiter_contract.py's stand-in `aiter` module answers with these; they are never a claim that AITER ran."""
import contextlib
import math
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from atomlite.model_ops.aiter import functions as names
from atomlite.model_ops.torch_ref.kv_write import to_cache_dtype
from atomlite.quant import mxfp4 as ref_mxfp4
from test_aiter_layout import gather, scale_destinations, scatter, weight_destinations


def _softmax_attend(q, k, v, scale, visible):
    """q [Lq, Hq, D], k/v [Lk, Hk, D], visible [Lq, Lk] -> out [Lq, Hq, D] (fp32), lse [Hq, Lq]."""
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(group, 1)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.einsum("hqk,khd->qhd", torch.exp(scores - lse[..., None]),
                        v.float().repeat_interleave(group, 1)), lse


def flash_mask(sq: int, sk: int, causal: bool, window_size) -> torch.Tensor:
    """ops/mha.py: query i sees keys in [i + sk - sq - left, i + sk - sq + right]; causal is bottom-right aligned."""
    left, right = window_size[0], window_size[1]
    if causal:
        right = 0 if right < 0 else min(right, 0)
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i + sk - sq - left
    if right >= 0:
        visible &= j <= i + sk - sq + right
    return visible


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                           window_size=(-1, -1), return_lse=False, **_):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        sq, sk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        o, l_b = _softmax_attend(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], scale,
                                 flash_mask(sq, sk, causal, window_size))
        out[cq[b]:cq[b + 1]], lse[:, cq[b]:cq[b + 1]] = o.to(q.dtype), l_b
    return (out, lse) if return_lse else out


def _paged_keys(key_cache, value_cache, table_row, ctx):
    blocks = table_row[:math.ceil(ctx / key_cache.shape[1])].long()
    return key_cache[blocks].flatten(0, 1)[:ctx], value_cache[blocks].flatten(0, 1)[:ctx]


def _check_cache_dtype(kv_cache_dtype, cache, activations):
    """kv_cache_dtype "fp8" means the cache holds aiter.dtypes.fp8 (one byte), "auto" the activations' dtype."""
    assert kv_cache_dtype == ("fp8" if cache.element_size() == 1 else "auto"), (kv_cache_dtype, cache.dtype)
    assert kv_cache_dtype == "fp8" or cache.dtype == activations.dtype, (cache.dtype, activations.dtype)


def paged_attention_v1(out, query, key_cache, value_cache, scale, block_tables, context_lens, kv_cache_layout,
                       workspace_buffer, max_context_len, kv_cache_dtype, k_scale, v_scale, sliding_window=0,
                       partition_size=256, **_):
    """pa_kernels.cuh: a token is masked iff token_idx < context_len - sliding_window (when sliding_window > 0);
    an fp8 cache is read as value * scale."""
    _check_cache_dtype(kv_cache_dtype, key_cache, query)
    if kv_cache_dtype == "fp8":
        key_cache, value_cache = key_cache.float() * k_scale, value_cache.float() * v_scale
    assert kv_cache_layout == "NHD" and partition_size % key_cache.shape[1] == 0
    assert block_tables.shape[1] >= math.ceil(max_context_len / key_cache.shape[1]) >= 1
    assert max_context_len >= int(context_lens.max())
    parts = math.ceil(max_context_len / partition_size)
    assert workspace_buffer.numel() >= query.numel() * parts * (query.element_size() + 8 / query.shape[-1])
    for s, ctx in enumerate(context_lens.tolist()):
        k, v = _paged_keys(key_cache, value_cache, block_tables[s], ctx)
        visible = torch.arange(ctx)[None, :] >= (ctx - sliding_window if sliding_window > 0 else 0)
        out[s] = _softmax_attend(query[s:s + 1], k, v, scale, visible)[0][0].to(out.dtype)
    return out


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """cache_kernels.cu: fp8 stores value / scale, converted with saturation."""
    _check_cache_dtype(kv_cache_dtype, key_cache, key)
    assert k_scale.dtype == v_scale.dtype == torch.float32
    if kv_cache_dtype == "fp8":
        assert key.dtype in (torch.bfloat16, torch.float16)  # the kernel quantizes what it is given
        key, value = key.float() / k_scale, value.float() / v_scale
    keep = slot_mapping >= 0
    slots, bs = slot_mapping[keep].long(), key_cache.shape[1]
    key_cache[slots // bs, slots % bs] = to_cache_dtype(key[keep], key_cache.dtype)
    value_cache[slots // bs, slots % bs] = to_cache_dtype(value[keep], value_cache.dtype)


def _rms(x, weight, eps, gemma_norm=False):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (weight.float() + (1 if gemma_norm else 0))


def rmsnorm2d_fwd(input, weight, epsilon, use_model_sensitive_rmsnorm=0):
    assert input.dim() == 2 and weight.dtype == input.dtype
    return _rms(input, weight, epsilon).to(input.dtype)


def gelu_tanh_and_mul(out, input):
    d = input.shape[-1] // 2
    out.copy_(F.gelu(input[..., :d].float(), approximate="tanh") * input[..., d:].float())


def dynamic_mxfp4_quant(x, scaling_mode="even", shuffle=False):
    """fp4_utils: Quark "even" scales; with shuffle the scale is [pad256(M), pad8(K/32)] in gemm_a4w4's order."""
    assert scaling_mode == "even" and shuffle
    packed, scale = ref_mxfp4.quantize(x.float())
    rows, cols = -(-scale.shape[0] // 256) * 256, -(-scale.shape[1] // 8) * 8
    padded = torch.full((rows, cols), 127, dtype=torch.uint8)
    padded[:scale.shape[0], :scale.shape[1]] = scale
    return packed, scatter(padded, scale_destinations(rows, cols))


def gemm_a4w4(A, B, A_scale, B_scale, out=None, dtype=None, bpreshuffle=True, **_):
    assert bpreshuffle and (out is None) != (dtype is None)
    m, kb = A.shape
    n = B.shape[0]
    w = gather(B.view(torch.uint8), weight_destinations(n, kb))
    w_scale = gather(B_scale.view(torch.uint8), scale_destinations(*B_scale.shape))[:n, :kb // 16]
    x_scale = gather(A_scale.view(torch.uint8), scale_destinations(*A_scale.shape))[:m, :kb // 16]
    y = ref_mxfp4.dequantize(A.view(torch.uint8), x_scale) @ ref_mxfp4.dequantize(w, w_scale).T
    if out is None:
        return y.to(dtype)
    assert out.shape[0] % 32 == 0
    out[:m] = y
    return out


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def gemm_a8w8(XQ, WQ, x_scale, w_scale, bias=None, dtype=torch.bfloat16, splitK=None):
    """Y = (XQ * x_scale) @ (WQ * w_scale)^T in float32 (op_tests/test_gemm_a8w8.py run_torch): x_scale [M, 1] per
    row, w_scale [N, 1] per output column, both float32; fp8 operands of one dtype."""
    assert XQ.dtype in FP8_DTYPES and WQ.dtype == XQ.dtype
    assert x_scale.shape == (XQ.shape[0], 1) and w_scale.shape == (WQ.shape[0], 1)
    assert x_scale.dtype == w_scale.dtype == torch.float32
    y = (XQ.float() * x_scale) @ (WQ.float() * w_scale).T
    return (y if bias is None else y + bias).to(dtype)


def gemm_a8w8_blockscale(XQ, WQ, x_scale, w_scale, dtype=torch.bfloat16, isBpreshuffled=False):
    """op_tests/test_gemm_a8w8_blockscale.py run_torch: x_scale [M, K/128] per 128 columns of a row, w_scale
    [ceil(N/128), K/128] per 128 x 128 block of the weight, row-major; K a multiple of 128."""
    assert not isBpreshuffled and XQ.dtype in FP8_DTYPES and WQ.dtype == XQ.dtype
    (m, k), n = XQ.shape, WQ.shape[0]
    assert k % 128 == 0 and x_scale.shape == (m, k // 128) and w_scale.shape == (-(-n // 128), k // 128)
    x = (XQ.float().view(m, k // 128, 128) * x_scale.unsqueeze(-1)).view(m, k)
    w = WQ.float() * w_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return (x @ w.T).to(dtype)


SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)
CAR_MAX_SIZE = 64 << 20  # AITER_CUSTOM_AR_MAX_SIZE's default (newer AITERs)


def custom_allreduce(self, group, device, max_size=8192 * 1024 * 8, **_):
    """CustomAllreduce(group, device, max_size): a communicator over `group`, which must not be an NCCL group (it
    exchanges IPC handles over it); disabled when its library did not load (the module's custom_ar) or the group
    has a size other than 2, 4, 6 or 8."""
    assert dist.get_backend(group) != dist.Backend.NCCL
    loaded = sys.modules[type(self).__module__].custom_ar
    self.group, self.max_size, self.capturing, self.registrations, self.closed = group, max_size, False, 0, False
    self.disabled = not loaded or dist.get_world_size(group) not in SUPPORTED_WORLD_SIZES


@contextlib.contextmanager
def capture(self):
    """Inside, all-reduces are recorded for the graph being captured; at the end the ranks register the captured
    buffers with each other."""
    self.capturing = True
    try:
        yield
    finally:
        self.capturing = False
        self.registrations += 1


def is_weak_contiguous(inp) -> bool:
    """Contiguous, or a view whose elements fill its storage from its offset to the end."""
    return inp.is_contiguous() or (inp.untyped_storage().nbytes() - inp.storage_offset() * inp.element_size()
                                   == inp.numel() * inp.element_size())


def should_custom_ar(self, inp, prefill_support=False):
    """A multiple of 16 bytes, weakly contiguous, up to max_size (0.1.7) or AITER_CUSTOM_AR_MAX_SIZE (newer AITERs,
    whose should_custom_ar takes prefill_support)."""
    size = inp.numel() * inp.element_size()
    newer = any(p["name"] == "prefill_support" for p in type(self).pinned[names.CUSTOM_ALL_REDUCE_METHODS[1]]["params"])
    limit = CAR_MAX_SIZE if newer else self.max_size
    return not self.disabled and size % 16 == 0 and is_weak_contiguous(inp) and size <= limit


def custom_all_reduce(self, input, use_new=True, open_fp8_quant=False):
    """The sum over the group's ranks, out of place; None where should_custom_ar refuses; zeros inside capture()
    when no graph is being captured (the warm-up passes before one)."""
    if not should_custom_ar(self, input):
        return None
    if self.capturing and not torch.cuda.is_current_stream_capturing():
        return torch.zeros_like(input)
    out = input.clone()
    dist.all_reduce(out, group=self.group)
    return out


def close(self):
    self.closed = True


SEMANTICS = {
    names.FLASH_VARLEN: flash_attn_varlen_func, names.PAGED_DECODE: paged_attention_v1,
    names.WRITE_KV_NHD: reshape_and_cache_flash,
    names.RMS_NORM: rmsnorm2d_fwd,
    names.GELU_TANH_AND_MUL: gelu_tanh_and_mul, names.MXFP4_QUANT: dynamic_mxfp4_quant, names.GEMM_A4W4: gemm_a4w4,
    names.GEMM_A8W8: gemm_a8w8, names.GEMM_A8W8_BLOCKSCALE: gemm_a8w8_blockscale,
    names.CUSTOM_ALL_REDUCE: custom_allreduce,
    **{path: method for path, method in zip(names.CUSTOM_ALL_REDUCE_METHODS,
                                            (capture, should_custom_ar, custom_all_reduce, close))},
}


def test_flash_mask_reproduces_aiter_docstring_examples():
    assert flash_mask(2, 5, True, (-1, -1)).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert flash_mask(5, 2, True, (-1, -1)).int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]


def test_window_w_minus_1_is_hf_window_w():
    window = 3
    visible = flash_mask(4, 6, True, (window - 1, 0))
    q_pos, k_pos = torch.arange(2, 6)[:, None], torch.arange(6)[None, :]
    assert torch.equal(visible, (q_pos - k_pos >= 0) & (q_pos - k_pos < window))
