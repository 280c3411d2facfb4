"""The gated MLP of Gemma's decoder layers: down(gelu_tanh(gate(x)) * up(x)), gate and up one merged projection,
column-parallel, down row-parallel."""
from torch import nn

from atomlite.distributed import split
from atomlite.model_ops.activation import GeluTanhAndMul
from atomlite.model_ops.fusion import Feeds
from atomlite.model_ops.linear_builder import LinearBuilder


class GatedGeluMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, lin: LinearBuilder, prefix: str):
        super().__init__()
        part = split(intermediate, lin.tp.rank, lin.tp.size, "intermediate_size")
        self.gate_up_proj = lin.merged(f"{prefix}.gate_up_proj", hidden, [intermediate, intermediate],
                                       rows=[part, part])
        self.act = GeluTanhAndMul(part.size)
        self.down_proj = lin.row_parallel(f"{prefix}.down_proj", part, hidden)

    def dataflow(self):
        yield Feeds(self.act, self.down_proj)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_up_proj(x)))
