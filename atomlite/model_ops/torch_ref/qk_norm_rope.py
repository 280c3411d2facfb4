import torch

from atomlite.model_ops.carriers import summed
from atomlite.model_ops.kernels import declare
from atomlite.model_ops.kv_spec import UNIT_SCALES
from atomlite.model_ops.torch_ref.kv_write import MASKED_WRITE, write_kv
from atomlite.model_ops.torch_ref.norm import rms_norm
from atomlite.model_ops.torch_ref.rope import apply_rope


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 slot_mapping: torch.Tensor | None = None, kv_scales: tuple[float, float] = UNIT_SCALES,
                 v_norm: bool = True):
    """q, k, v [T, H, D] raw projections -> (rope(norm(q) w_q), rope(norm(k) w_k), norm(v)). With caches, k and v
    are stored at slot_mapping (slots < 0 skipped) and returned as None (v alone when k_cache is None: a layer that
    derives K from V); k = v = None (a KV-sharing layer) gives q alone. kv_scales: as write_kv's. q, k and v may
    be PartialSums (a split-K QKV projection's slices), added up first. v_norm=False: v is stored as projected (no
    norm), for models whose attention norms q and k alone."""
    q, k, v = summed(q), summed(k), summed(v)
    q = apply_rope(rms_norm(q, q_weight, eps), cos, sin)
    if k is None:
        return q, None, None
    k, v = apply_rope(rms_norm(k, k_weight, eps), cos, sin), rms_norm(v, None, eps) if v_norm else v
    if v_cache is None:
        return q, k, v
    write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    return q, None, None


declare("qk_norm_rope", "torch", qk_norm_rope, capabilities={"reads_partial_sums"}, graph_unsafe=MASKED_WRITE)
