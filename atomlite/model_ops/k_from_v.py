"""Keys rebuilt from values, for layers whose K is a function of V (Gemma 4's k_eq_v layers: V = norm(raw k) and
K = rope(norm(raw k) * w_k) = rope(V * w_k)). Such a layer's cache holds V only, half the bytes per token."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KFromV:
    """K = rope(V * weight) at each key's own position.

    cos, sin: fp32 rotate-half tables [max_positions, head_dim] (pairs (j, j + head_dim/2)); only the first
    rotary_pairs frequencies turn (proportional RoPE), the others have cos 1 and sin 0.
    """
    weight: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    rotary_pairs: int


def rotary_pairs(inv_freq: torch.Tensor) -> int:
    """How many leading frequencies turn; they must be the leading ones (the kernels read just those)."""
    turning = int((inv_freq != 0).sum())
    if bool((inv_freq[:turning] == 0).any()):
        raise ValueError("deriving K from V needs the rotating frequencies first")
    return turning
