from torch import nn

from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import GatedInput


class GeluTanhAndMul(nn.Module):
    """gelu_tanh(gate) * up of x = [gate | up]. Linked to a down projection that computes it as it reads its input
    (model_ops.fusion), it hands x over as a GatedInput where that projection takes one at this call."""

    def __init__(self, dim: int):
        super().__init__()
        self._fn = dispatch.choose("gelu_tanh_and_mul", dim=dim).fn
        self.reader_takes_gated = None  # set by fusion.link: takes_gated of the down projection

    def forward(self, x):
        if self.reader_takes_gated is not None and self.reader_takes_gated(x):
            return GatedInput(x)
        return self._fn(x)

    def can(self, capability: str) -> bool:
        return capability == "writes_gated_input"

    def link_consumer(self, consumer: nn.Module, forms: set[str]) -> None:
        self.reader_takes_gated = consumer.takes_gated if "gated_input" in forms else None
