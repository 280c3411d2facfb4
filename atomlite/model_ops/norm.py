import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.linear import copy_weight
from atomlite.model_ops.partial_sums import NormedPair, PartialSums


class RMSNorm(nn.Module):
    """Gemma RMSNorm (plain weight)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.weight.weight_loader = copy_weight
        self._norm = dispatch.choose("rms_norm", dim=dim).fn
        into_residual = dispatch.choose("rms_norm_residual", dim=dim)
        self._into_residual = into_residual.fn
        self._writes_quantized = into_residual.backend == "triton"  # the Triton kernel writes QuantizedRows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, self.weight, self.eps)

    def add_to_residual(self, x: "torch.Tensor | PartialSums | NormedPair", residual: torch.Tensor,
                        scale: torch.Tensor | None = None, then: "RMSNorm | tuple | None" = None,
                        feeding: nn.Module | None = None) -> tuple[torch.Tensor, object]:
        """(residual + norm(x)) [* scale], and `then`'s norm of that (None without `then`), in one pass. x may be
        a linear's PartialSums, or two branches' NormedPair (joined). `then` may be a tuple of up to 3 norms
        (RMSNorms or plain weights, same eps) of the sum, for the branches that read it: their outputs come as a
        tuple. feeding: the linear that reads (the first of) `then`'s norms; where it asks for its input quantized
        (input_quantization), that output comes in its form (QuantizedRows) and its quantization launch is saved."""
        quantize = None
        if then is not None and feeding is not None and self._writes_quantized:
            quantize = feeding.input_quantization(residual)
        extra = {} if quantize is None else {"quantize": quantize}
        if isinstance(then, tuple):
            next_weight = tuple(n if isinstance(n, torch.Tensor) else n.weight for n in then)
        else:
            next_weight = None if then is None else then.weight
        return self._into_residual(x, residual, self.weight, self.eps, scale, next_weight, **extra)

    def joined(self, x: "torch.Tensor | PartialSums", other: "RMSNorm", y: "torch.Tensor | PartialSums") -> NormedPair:
        """self(x) + other(y), for the residual update that reads it to compute (add_to_residual)."""
        return NormedPair(x, y, self.weight, other.weight)
