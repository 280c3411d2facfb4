"""Attention without a KV cache for encoders: every token of a sequence sees every other token of the same sequence,
and nothing of the sequences packed beside it."""
import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.packed import PackedSequences


class EncoderAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.kernel = dispatch.choose("encoder_attention", head_dim=head_dim, gqa=num_heads // num_kv_heads,
                                      dtype=torch.get_default_dtype())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KV heads, D], T the packed sequences' rows; returns [T, H, D]."""
        return self.kernel.fn(q, k, v, packed, self.scale)
