from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import InputQuantization, NormedPair, PartialSums, TokenQuantization, summed
from atomlite.model_ops.linear import copy_weight


@dataclass(frozen=True)
class Residual:
    """The residual stream, and the norms of it that the residual update which made it computed in the same kernel
    (RMSNorm.add_to_residual, for the norms fusion linked to follow it). A forward reads a norm of the stream
    through normed(norm): the update's result where it computed that norm, else the norm's own kernel."""
    stream: torch.Tensor
    norms: tuple["RMSNorm", ...] = ()
    outputs: tuple = ()  # norms[i](stream), each a tensor or the QuantizedRows / TokenRows its reader asked for

    def normed(self, norm: "RMSNorm") -> "torch.Tensor | object":
        for computed, output in zip(self.norms, self.outputs):
            if computed is norm:
                return output
        return norm(self.stream)


class RMSNorm(nn.Module):
    """Gemma RMSNorm (plain weight; learned=False: a weight the owner sets after loading, not a checkpoint tensor).

    As a residual update (add_to_residual) it computes, in the same kernel, the norms linked to follow it
    (model_ops.fusion), and returns them with the sum (Residual).
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
        self.last_reader_quantization: Callable | None = None  # and of the last norm's (of two or three)
        self.joins_lazily = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, self.weight, self.eps)

    def can(self, capability: str) -> bool:
        """What its residual update's kernel can do; and joined can leave two branches as a NormedPair."""
        return capability == "writes_normed_pair" or self.residual_kernel.can(capability)

    def link_next_norms(self, norms: tuple["RMSNorm", ...], quantized_reader: nn.Module | None,
                        last_reader: nn.Module | None = None) -> None:
        """fusion.link: the norms applied to this update's sum next (same eps), the linear that reads the first
        one's output quantized (QuantizedRows or TokenRows) where it asks for them (input_quantization), and the
        layer that reads the last one's as TokenRows."""
        self.next_norms = norms
        self.reader_quantization = None if quantized_reader is None else quantized_reader.input_quantization
        self.last_reader_quantization = None if last_reader is None else last_reader.input_quantization

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        """fusion.link: the residual update that reads joined's output; it joins the pair itself."""
        self.joins_lazily = "normed_pair" in forms

    def add_to_residual(self, x: "torch.Tensor | PartialSums | NormedPair", residual: torch.Tensor,
                        scale: torch.Tensor | None = None) -> Residual:
        """(residual + self(x)) [* scale], with the linked next norms of it from the same pass (see the class)."""
        weights = tuple(norm.weight for norm in self.next_norms)
        next_weight = weights[0] if len(weights) == 1 else weights or None
        quantize = self._input_quantization(residual)
        extra = {} if quantize is None else {"quantize": quantize}
        if self.last_reader_quantization is not None:
            extra["quantize_last"] = self.last_reader_quantization(residual)
        total, outs = self.residual_kernel.fn(x, residual, self.weight, self.eps, scale, next_weight, **extra)
        if not self.next_norms:
            return Residual(total)
        return Residual(total, self.next_norms, outs if isinstance(outs, tuple) else (outs,))

    def _input_quantization(self, residual: torch.Tensor) -> InputQuantization | TokenQuantization | None:
        return None if self.reader_quantization is None else self.reader_quantization(residual)

    def joined(self, x: "torch.Tensor | PartialSums", other: "RMSNorm",
               y: "torch.Tensor | PartialSums") -> "torch.Tensor | NormedPair":
        """self(x) + other(y): left to the residual update that reads it where that is linked to join it."""
        if self.joins_lazily:
            return NormedPair(x, y, self.weight, other.weight)
        return self(summed(x)) + other(summed(y))
