import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.linear import copy_weight


class RMSNorm(nn.Module):
    """Gemma RMSNorm (plain weight)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.weight.weight_loader = copy_weight
        self._norm = dispatch.choose("rms_norm", dim=dim).fn
        self._add_norm = dispatch.choose("add_rms_norm", dim=dim).fn
        self._into_residual = dispatch.choose("rms_norm_residual", dim=dim).fn
        self._pair_sum = dispatch.choose("rms_norm_pair_sum", dim=dim).fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        return self._add_norm(x, residual, self.weight, self.eps)

    def add_to_residual(self, x: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor | None = None,
                        then: "RMSNorm | None" = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(residual + norm(x)) [* scale], and `then`'s norm of that (None without `then`), in one pass."""
        return self._into_residual(x, residual, self.weight, self.eps, scale, None if then is None else then.weight)

    def plus(self, x: torch.Tensor, other: "RMSNorm", y: torch.Tensor) -> torch.Tensor:
        """self(x) + other(y), in one pass."""
        return self._pair_sum(x, y, self.weight, other.weight, self.eps)
