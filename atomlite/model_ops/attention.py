import math

import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.context import ForwardContext, GroupBatch
from atomlite.model_ops.k_from_v import KFromV, rotary_pairs
from atomlite.model_ops.rope import RotaryEmbedding
from atomlite.model_ops.kv_spec import UNIT_SCALES


class Attention(nn.Module):
    """Writes this step's K/V into the layer's paged cache, then attends over the cache.

    The engine binds the cache (bind_cache) after planning memory; a layer that reuses another layer's K/V
    (KV sharing) is bound to that layer's cache with writes_kv=False and is called with k = v = None.
    With key_rope (the layer's RotaryEmbedding), K is a function of V (K = rope(V * w_k), see k_from_v): the layer
    stores V alone and the attention kernel rebuilds each key from the rope's tables; its KV spec says k_from_v.
    kv_scales: the (K, V) scales an fp8 cache stores this layer's keys and values with (x / scale), from the
    checkpoint when it has them (set_kv_scales); a 16-bit cache ignores them.
    bidirectional_spans: the layer honours ForwardContext.key_ends, so the queries of an image block see the whole
    block (the window still counts back from each query); layers without it attend causally whatever key_ends says.
    Gemma 4 sets it on its sliding layers when the text config's use_bidirectional_attention is "vision" (31B,
    26B-A4B), as transformers masks them (create_masks_for_vision_model); its full-attention layers stay causal.
    value_norm=False: forward_raw stores V as projected (attention that norms q and k alone); by default V is
    RMS-normed too.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, window: int | None,
                 key_rope: RotaryEmbedding | None = None, bidirectional_spans: bool = False, value_norm: bool = True):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.window, self.key_rope = scale, window, key_rope
        self.bidirectional_spans = bidirectional_spans
        shape = dict(head_dim=head_dim, window=window is not None, gqa=num_heads // num_kv_heads)
        if bidirectional_spans:
            shape["bidirectional_spans"] = True
        if key_rope is not None:
            shape["k_from_v"] = True
            self.rotary_pairs = rotary_pairs(key_rope.inv_freq)
        self.attend_kernel = dispatch.choose("attention", **shape)
        self._attend = self.attend_kernel.fn
        self._write = dispatch.choose("write_kv", head_dim=head_dim).fn
        self.prepare_options = {} if value_norm else {"v_norm": False}
        self.prepare_kernel = dispatch.choose("qk_norm_rope", head_dim=head_dim, **self.prepare_options)
        self.prepare_qkv = self.prepare_kernel.fn
        self.reader_quantization = None  # set by fusion.link: input_quantization of o_proj reading QuantizedRows
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

    @property
    def step_metadata(self):
        """The attention kernel's per-step metadata function (built once per KV group and step), or None."""
        return getattr(self.attend_kernel.fn, "step_metadata", None)

    def can(self, capability: str) -> bool:
        """What its kernels can take in (the q/k/v prepare's) and give out (the attention's)."""
        return self.prepare_kernel.can(capability) or self.attend_kernel.can(capability)

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.reader_quantization = consumer.input_quantization if "quantized_rows" in forms else None

    def forward_raw(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                    sin: torch.Tensor, ctx: ForwardContext):
        """Raw projections in (PartialSums where linked to a projection that returns them): q/k norms, RoPE, v norm
        (unless value_norm=False) and the KV write as one op (qk_norm_rope), then attention. Out: [T, H, D]; or,
        linked to a reader of QuantizedRows, [T, H * D] in the form it asks for (input_quantization) where the kernel
        writes that."""
        group = ctx.groups[self.group_id]
        caches = (self.k_cache, self.v_cache, group.slot_mapping) if k is not None else ()
        q, _, _ = self.prepare_qkv(q, k, v, q_weight, k_weight, eps, cos, sin, *caches, kv_scales=self.kv_scales,
                                   **self.prepare_options)
        quantize = None if self.reader_quantization is None else self.reader_quantization(q.flatten(1))
        return self._attention(q, ctx, group, k_weight, quantize)

    def _attention(self, q: torch.Tensor, ctx: ForwardContext, group: GroupBatch,
                   k_weight: torch.Tensor | None = None, quantize=None):
        extra = dict(host=ctx.host, derived=group.derived, kv_scales=self.kv_scales)
        if quantize is not None:
            extra["quantize"] = quantize
        if self.bidirectional_spans and ctx.key_ends is not None:
            extra["key_ends"] = ctx.key_ends
        if self.key_rope is not None:
            rope = self.key_rope  # its tables are read here, so they follow the module wherever it moves
            extra["k_from_v"] = KFromV(k_weight, rope.cos_table, rope.sin_table, self.rotary_pairs)
        return self._attend(q, self.k_cache, self.v_cache, group.block_table, ctx.seq_lens, ctx.query_start_loc,
                            self.scale, self.window, **extra)
