import torch
import torch.nn.functional as F
from torch import nn

from atomlite.distributed import Shard, TensorParallel, split
from atomlite.model_ops.linear import copy_weight
from atomlite.model_ops.sharding import read_narrowed


class ScaledEmbedding(nn.Module):
    """E[ids] * scale, the scale rounded to the weight dtype first (as Gemma does)."""

    def __init__(self, num_embeddings: int, dim: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim), requires_grad=False)
        self.weight.weight_loader = copy_weight
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight) * torch.tensor(self.scale, dtype=self.weight.dtype)


class VocabParallelEmbedding(ScaledEmbedding):
    """A ScaledEmbedding holding rows `vocab` of the table: each rank looks up the ids it holds, zeros for the
    others, and the all-reduce adds the one row each id has."""

    def __init__(self, vocab: Shard, dim: int, scale: float, tp: TensorParallel):
        super().__init__(vocab.size, dim, scale)
        self.vocab, self.tp = vocab, tp
        read_narrowed(self.weight, 0, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab.start
        outside = (local < 0) | (local >= self.vocab.size)
        rows = super().forward(local.masked_fill(outside, 0))
        return self.tp.all_reduce(rows.masked_fill(outside.unsqueeze(-1), 0))


def token_embedding(vocab_size: int, hidden: int, scale: float, tp: TensorParallel) -> ScaledEmbedding:
    """A token table (tied: its rows also the logits' weights), vocab-parallel under tensor parallelism."""
    vocab = split(vocab_size, tp.rank, tp.size, "vocab_size")
    if vocab.whole:
        return ScaledEmbedding(vocab_size, hidden, scale)
    return VocabParallelEmbedding(vocab, hidden, scale, tp)
