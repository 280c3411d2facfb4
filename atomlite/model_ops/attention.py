import math

import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.context import ForwardContext, GroupBatch
from atomlite.model_ops.k_from_v import KFromV, rotary_pairs
from atomlite.model_ops.rope import RotaryEmbedding
from atomlite.model_ops.torch_ref.kv_write import UNIT_SCALES


class Attention(nn.Module):
    """Writes this step's K/V into the layer's paged cache, then attends over the cache.

    The engine binds the cache (bind_cache) after planning memory; a layer that reuses another layer's K/V
    (KV sharing) is bound to that layer's cache with writes_kv=False and is called with k = v = None.
    With key_rope (the layer's RotaryEmbedding), K is a function of V (K = rope(V * w_k), see k_from_v): the layer
    stores V alone and the attention kernel rebuilds each key from the rope's tables; its KV spec says k_from_v.
    kv_scales: the (K, V) scales an fp8 cache stores this layer's keys and values with (x / scale), from the
    checkpoint when it has them (set_kv_scales); a 16-bit cache ignores them.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, window: int | None,
                 key_rope: RotaryEmbedding | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.window, self.key_rope = scale, window, key_rope
        shape = dict(head_dim=head_dim, window=window is not None, gqa=num_heads // num_kv_heads)
        if key_rope is not None:
            shape["k_from_v"] = True
            self.rotary_pairs = rotary_pairs(key_rope.inv_freq)
        attend = dispatch.choose("attention", **shape)
        self._attend = attend.fn
        self._writes_quantized = attend.backend == "triton"  # its split-KV merge can write QuantizedRows
        self._write = dispatch.choose("write_kv", head_dim=head_dim).fn
        self.prepare_qkv = dispatch.choose("qk_norm_rope", head_dim=head_dim).fn
        self.k_cache = self.v_cache = None
        self.group_id: int | None = None
        self.kv_scales = UNIT_SCALES

    def set_kv_scales(self, k_scale: float, v_scale: float) -> None:
        if not all(math.isfinite(s) and s > 0 for s in (k_scale, v_scale)):
            raise ValueError(f"KV cache scales must be finite and positive, got K {k_scale}, V {v_scale}")
        self.kv_scales = (float(k_scale), float(v_scale))

    def bind_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor, group_id: int) -> None:
        self.k_cache, self.v_cache, self.group_id = k_cache, v_cache, group_id

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                ctx: ForwardContext) -> torch.Tensor:
        group = ctx.groups[self.group_id]
        if self.key_rope is not None:
            raise NotImplementedError("a layer that derives K from V attends through forward_raw (it needs w_k)")
        if k is not None:
            self._write(k, v, self.k_cache, self.v_cache, group.slot_mapping, self.kv_scales)
        return self._attention(q, ctx, group)

    def forward_raw(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor, ctx: ForwardContext, feeding: nn.Module | None = None):
        """Raw projections in: q/k norms, RoPE, v norm and the KV write as one op (qk_norm_rope), then attention.
        feeding: the linear that reads the output; then the output comes as its input, [T, H * D], or in the
        quantized form that linear asks for (input_quantization), where the kernels can write that."""
        group = ctx.groups[self.group_id]
        caches = (self.k_cache, self.v_cache, group.slot_mapping) if k is not None else ()
        q, _, _ = self.prepare_qkv(q, k, v, q_weight, k_weight, eps, cos, sin, *caches, kv_scales=self.kv_scales)
        if feeding is None:
            return self._attention(q, ctx, group, k_weight)
        rows = q.flatten(1)
        quantize = feeding.input_quantization(rows) if self._writes_quantized else None
        out = self._attention(q, ctx, group, k_weight, quantize)
        return out.flatten(1) if isinstance(out, torch.Tensor) else out

    def _attention(self, q: torch.Tensor, ctx: ForwardContext, group: GroupBatch,
                   k_weight: torch.Tensor | None = None, quantize=None):
        extra = dict(host=ctx.host, derived=group.derived, kv_scales=self.kv_scales)
        if quantize is not None:
            extra["quantize"] = quantize
        if self.key_rope is not None:
            rope = self.key_rope  # its tables are read here, so they follow the module wherever it moves
            extra["k_from_v"] = KFromV(k_weight, rope.cos_table, rope.sin_table, self.rotary_pairs)
        return self._attend(q, self.k_cache, self.v_cache, group.block_table, ctx.seq_lens, ctx.query_start_loc,
                            self.scale, self.window, **extra)
