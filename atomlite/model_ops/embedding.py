import torch
import torch.nn.functional as F
from torch import nn

from atomlite.model_ops.linear import copy_weight


class ScaledEmbedding(nn.Module):
    """E[ids] * scale, the scale rounded to the weight dtype first (as Gemma does)."""

    def __init__(self, num_embeddings: int, dim: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim), requires_grad=False)
        self.weight.weight_loader = copy_weight
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight) * torch.tensor(self.scale, dtype=self.weight.dtype)
