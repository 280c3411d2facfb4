"""N local processes joined by torch.distributed: for tests and single-host runs on CPU (gloo)."""
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from atomlite.distributed.parallel import TensorParallel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, size: int, port: int, backend: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=size)
    try:
        fn(TensorParallel(rank, size), *args)
    finally:
        dist.destroy_process_group()


def run_local(fn, size: int, *args, backend: str = "gloo") -> None:
    """fn(tp, *args) in each of `size` spawned processes, one per rank; raises if any fails. fn and args must be
    picklable (a module-level function)."""
    mp.spawn(_worker, args=(size, free_port(), backend, fn, args), nprocs=size, join=True)
