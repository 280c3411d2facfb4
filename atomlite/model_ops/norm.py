from collections.abc import Callable

import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import InputQuantization, NormedPair, PartialSums, summed
from atomlite.model_ops.linear import copy_weight


class RMSNorm(nn.Module):
    """Gemma RMSNorm (plain weight; learned=False: a weight the owner sets after loading, not a checkpoint tensor).

    As a residual update (add_to_residual) it computes, in the same kernel, the norms linked to follow it
    (model_ops.fusion), and hands each its result: a norm applied to the sum it was handed returns that result.
    """

    def __init__(self, dim: int, eps: float, learned: bool = True):
        super().__init__()
        self.eps = eps
        if learned:
            self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
            self.weight.weight_loader = copy_weight
        else:
            self.register_buffer("weight", None, persistent=False)
        self._norm = dispatch.choose("rms_norm", dim=dim).fn
        self.residual_kernel = dispatch.choose("rms_norm_residual", dim=dim)
        # set by fusion.link (references kept out of the module tree, which holds each layer once)
        self.next_norms: tuple[RMSNorm, ...] = ()
        self.reader_quantization: Callable | None = None  # the input_quantization of the first norm's reader
        self.joins_lazily = False
        self._handed: tuple[torch.Tensor, object] | None = None  # (the sum, this norm of it)

    def forward(self, x: torch.Tensor) -> "torch.Tensor | object":
        handed, self._handed = self._handed, None
        if handed is not None and handed[0] is x:
            return handed[1]
        return self._norm(x, self.weight, self.eps)

    def can(self, capability: str) -> bool:
        """What its residual update's kernel can do; and joined can leave two branches as a NormedPair."""
        return capability == "writes_normed_pair" or self.residual_kernel.can(capability)

    def link_next_norms(self, norms: tuple["RMSNorm", ...], quantized_reader: nn.Module | None) -> None:
        """fusion.link: the norms applied to this update's sum next (same eps), and the linear that reads the
        first one's output as QuantizedRows where it asks for them (input_quantization)."""
        self.next_norms = norms
        self.reader_quantization = None if quantized_reader is None else quantized_reader.input_quantization

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        """fusion.link: the residual update that reads joined's output; it joins the pair itself."""
        self.joins_lazily = "normed_pair" in forms

    def add_to_residual(self, x: "torch.Tensor | PartialSums | NormedPair", residual: torch.Tensor,
                        scale: torch.Tensor | None = None) -> torch.Tensor:
        """(residual + self(x)) [* scale]; the linked next norms of it come from the same pass (see the class)."""
        weights = tuple(norm.weight for norm in self.next_norms)
        next_weight = weights[0] if len(weights) == 1 else weights or None
        quantize = self._input_quantization(residual)
        extra = {} if quantize is None else {"quantize": quantize}
        total, outs = self.residual_kernel.fn(x, residual, self.weight, self.eps, scale, next_weight, **extra)
        for norm, out in zip(self.next_norms, outs if isinstance(outs, tuple) else (outs,)):
            norm.hand_over(total, out)
        return total

    def _input_quantization(self, residual: torch.Tensor) -> InputQuantization | None:
        return None if self.reader_quantization is None else self.reader_quantization(residual)

    def hand_over(self, source: torch.Tensor, output: object) -> None:
        """output is self(source), computed by the residual update that made source: the next self(source)
        returns it."""
        self._handed = (source, output)

    def joined(self, x: "torch.Tensor | PartialSums", other: "RMSNorm",
               y: "torch.Tensor | PartialSums") -> "torch.Tensor | NormedPair":
        """self(x) + other(y): left to the residual update that reads it where that is linked to join it."""
        if self.joins_lazily:
            return NormedPair(x, y, self.weight, other.weight)
        return self(summed(x)) + other(summed(y))
