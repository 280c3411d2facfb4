from torch import nn

from atomlite.model_ops import dispatch


class GeluTanhAndMul(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self._fn = dispatch.choose("gelu_tanh_and_mul", dim=dim).fn

    def forward(self, x):
        return self._fn(x)
