"""The tensor-parallel group a model is built for, read by its layers at construction (like dispatch.use)."""
import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist


class CustomAllReduceUnavailable(RuntimeError):
    """A custom all-reduce could not be set up on this rank (the group then sums through its collective library)."""


@dataclass(frozen=True)
class TensorParallel:
    """This process's rank among `size` processes that each hold one shard of every sharded weight. At size 1 the
    collectives return their input: a single-process model runs no extra op."""
    rank: int = 0
    size: int = 1
    group: object = None  # the torch.distributed process group; None: the default one
    # The group's custom all-reduce for small rows (model_ops.peer_memory.PeerMemory, or on ROCm
    # model_ops.aiter.all_reduce.AiterAllReduce): serves(x), all_reduce(x), serves_pair(a, b), all_reduce_pair(a, b),
    # hands_over_rank_partials and, where that is True, takes_rank_partials(rows, dim, element_size) and
    # hand_over(parts) (model_ops.sharding.reduced); capture() and close(). None: the collective library sums
    # everything.
    peers: object = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of x (each rank's partial result of a row-parallel product); x may be summed in place."""
        if self.size == 1:
            return x
        if self.peers is not None and self.peers.serves(x):
            return self.peers.all_reduce(x)
        x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def all_reduced(self, *xs: torch.Tensor) -> tuple:
        """xs (tensors of one shape) each summed over the ranks, in one collective."""
        if self.size == 1:
            return xs
        if len(xs) == 1:
            return (self.all_reduce(xs[0]),)
        if len(xs) == 2 and self.peers is not None and self.peers.serves_pair(*xs):
            return self.peers.all_reduce_pair(*xs)
        return tuple(self.all_reduce(torch.stack(xs)).unbind(0))

    def capturing(self):
        """The block a rank captures its graphs in (all of one capture_all, warm-up passes included)."""
        return self.peers.capture() if self.peers is not None else contextlib.nullcontext()

    def close_peers(self) -> None:
        """Frees the custom all-reduce's buffers, once no graph that captured it is left."""
        if self.peers is not None:
            self.peers.close()

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """x as rank 0 holds it, on every rank (in place; x contiguous)."""
        if self.size > 1:
            dist.broadcast(x, src=0, group=self.group)
        return x

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest of the ranks' values (a per-rank memory budget that every rank must fit)."""
        if self.size == 1:
            return value
        x = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(x, op=dist.ReduceOp.MIN, group=self.group)
        return int(x.item())

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' x side by side on the last dim, rank 0 first (column-parallel outputs made whole)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()
_active: ContextVar[TensorParallel] = ContextVar("atomlite_tensor_parallel", default=SINGLE)


def current() -> TensorParallel:
    """The group of the enclosing `use` block; a single process outside one."""
    return _active.get()


@contextlib.contextmanager
def use(tp: TensorParallel):
    """Layers built inside this block hold tp.rank's shard of their weights and join shards over tp."""
    token = _active.set(tp)
    try:
        yield tp
    finally:
        _active.reset(token)


_graph_steps: ContextVar[bool] = ContextVar("atomlite_graph_steps", default=False)


@contextlib.contextmanager
def graph_steps():
    """The forwards that make a graph (its warm-up passes and its capture), which every rank runs alike: the
    small all-reduces in them may take the group's custom all-reduce (TensorParallel.peers), whose kernels the
    warm-up passes then load before the capture (the one-shot kernel; AITER's answers zeros there)."""
    token = _graph_steps.set(True)
    try:
        yield
    finally:
        _graph_steps.reset(token)


def in_graph_steps() -> bool:
    return _graph_steps.get()
