import torch

from atomlite.model_ops.torch_ref.norm import rms_norm
from atomlite.model_ops.kernels import declare


def rotate_by_axes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] -> the first half of each head turned by the patch's x angles, the second by its y angles, each
    half as rotate-half RoPE; cos, sin: [T, 2, D / 2] (per axis, both halves of its pairs' angles)."""
    halves = x.unflatten(-1, (2, -1))
    pair = halves.shape[-1] // 2
    turned = torch.cat((-halves[..., pair:], halves[..., :pair]), dim=-1)
    return (halves * cos[:, None] + turned * sin[:, None]).flatten(-2)


def axial_qkv_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                        cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """A vision tower's attention inputs from its q/k/v projections qkv [T, (H + 2 KV) * D]: each head RMS-normed
    (q and k with their learned weights, v without one), q and k turned by 2-D axial RoPE (rotate_by_axes);
    returns [T, H + 2 KV, D], the q, k and v heads one after another."""
    head_dim = cos.shape[-1] * 2
    q, k, v = qkv.unflatten(-1, (-1, head_dim)).split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    q = rotate_by_axes(rms_norm(q, q_weight, eps), cos, sin)
    k = rotate_by_axes(rms_norm(k, k_weight, eps), cos, sin)
    return torch.cat([q, k, rms_norm(v, None, eps)], dim=1)


declare("axial_qkv_norm_rope", "torch", axial_qkv_norm_rope)
