import torch
import torch.nn.functional as F
from atomlite.model_ops.kernels import declare


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] on the last dim; returns gelu_tanh(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


declare("gelu_tanh_and_mul", "torch", gelu_tanh_and_mul)
