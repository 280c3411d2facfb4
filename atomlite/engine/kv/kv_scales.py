"""Per-layer scales of an fp8 KV cache, from the checkpoint where they describe what the cache holds.

Quark exports one K and one V scale per layer (amax / 448). With kv_cache_post_rope they were observed on the cached
values themselves: each layer takes its own, a layer that reads another layer's cache (KV sharing) takes that
layer's, and a layer without a V scale (k_eq_v: Quark writes none) keeps 1. Without it they were observed on the raw
k_proj / v_proj outputs, before the models' K/V norms, and do not bound what the cache holds (on a tiny export by
Quark itself the normalized values reach 509-751 times the scale, past e4m3's 448): every layer keeps 1, which
RMS-normalized K and V fit.
"""
import torch

from atomlite.model_ops.kv_spec import KVSpec


def apply_kv_scales(model, specs: list[KVSpec], quant, cache_dtype: torch.dtype) -> str | None:
    """Sets each attention layer's scales; returns the startup line that says which were used (None: no fp8 cache).
    quant: the checkpoint's KVCacheQuant, or None."""
    if cache_dtype.itemsize != 1:
        return None
    found = getattr(model, "checkpoint_kv_scales", {})
    if quant is None or not found:
        return "fp8 KV cache: unit scales (the checkpoint has no KV scales)"
    if not quant.post_rope:
        return ("fp8 KV cache: unit scales; the checkpoint's KV scales (Quark, kv_cache_post_rope false) were "
                "observed before the K/V norms and do not bound the normalized values the cache holds")
    layers = model.attention_layers()
    for i, (layer, spec) in enumerate(zip(layers, specs)):
        source = spec.target if spec.kind == "shared" else i
        layer.set_kv_scales(found.get((source, "k"), 1.0), found.get((source, "v"), 1.0))
    k_scales, v_scales = [layer.kv_scales[0] for layer in layers], [layer.kv_scales[1] for layer in layers]
    return (f"fp8 KV cache: the checkpoint's per-layer scales (K {min(k_scales):.3g}-{max(k_scales):.3g}, "
            f"V {min(v_scales):.3g}-{max(v_scales):.3g}; 1 where it has none)")
