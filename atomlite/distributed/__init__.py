"""Tensor parallelism: which shard of each weight a process holds, and the collectives that join the shards."""
from atomlite.distributed.parallel import TensorParallel, current, use
from atomlite.distributed.shards import Shard, kv_heads_of_rank, split

__all__ = ["TensorParallel", "current", "use", "Shard", "kv_heads_of_rank", "split"]
