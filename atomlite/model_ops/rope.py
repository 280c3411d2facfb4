"""Rotary embeddings with cos/sin tables computed once in fp32 (per position, exactly as position * inv_freq)."""
import torch
from torch import nn


# Frequencies live on the host (whatever the default device): layers read from them which ones turn.
def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim))


def proportional_inv_freq(head_dim: int, theta: float, partial_rotary_factor: float) -> torch.Tensor:
    """Only the first int(factor * head_dim // 2) frequencies rotate (denominator is the full head_dim)."""
    rotated = int(partial_rotary_factor * head_dim // 2)
    inv = torch.zeros(head_dim // 2, dtype=torch.float32, device="cpu")
    inv[:rotated] = 1.0 / (theta ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float32, device="cpu") / head_dim))
    return inv


ROPE_TYPES = ("default", "proportional", "linear")


def inv_freq_from_params(head_dim: int, params: dict) -> torch.Tensor:
    kind = params.get("rope_type", "default")
    if kind == "default":
        return default_inv_freq(head_dim, params["rope_theta"])
    if kind == "proportional":
        return proportional_inv_freq(head_dim, params["rope_theta"], params.get("partial_rotary_factor", 1.0))
    if kind == "linear":  # positions divided by factor, which is the same as frequencies divided by it
        return default_inv_freq(head_dim, params["rope_theta"]) / params["factor"]
    raise ValueError(f"rope_type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, inv_freq: torch.Tensor, max_positions: int):
        super().__init__()
        self.inv_freq = inv_freq  # on the host: which frequencies turn (see k_from_v)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_table", emb.cos(), persistent=False)
        self.register_buffer("sin_table", emb.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_table[positions].to(dtype), self.sin_table[positions].to(dtype)
