"""All-reduce latency as a tensor-parallel decode step pays it: N all-reduces of [rows, hidden] bf16 captured in one
CUDA/HIP graph, replayed; per all-reduce time = replay time / N; through the collective library (nccl) and through
atomlite's one-shot kernel over peer memory (on two ranks also pushing into the peer's slot), on the same rows. One process per GPU (atomlite.distributed.local).
    python bench/all_reduce.py --size 2 --hidden 5376 --rows 1,16,64
Run it under different NCCL_PROTO / NCCL_ALGO settings to compare them (keep NCCL_NVLS_ENABLE=0)."""
import argparse
import os

import torch
import torch.distributed as dist

from atomlite.distributed.local import run_local
from atomlite.model_ops.peer_memory import PeerMemory
from atomlite.model_ops.triton import all_reduce

CALLS, REPLAYS = 120, 20  # 120: two per layer of a 60-layer model


def _time_graph(graph, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def _rank(tp, hidden: int, rows: list[int]) -> None:
    torch.cuda.set_device(tp.rank)
    peers = PeerMemory(tp.rank, tp.size, torch.device("cuda", tp.rank))
    for count in rows:
        x = torch.ones(count, hidden, dtype=torch.bfloat16, device="cuda")
        dist.all_reduce(x)  # the communicator starts outside the capture
        torch.cuda.synchronize()
        ways = {"nccl": (dist.all_reduce, None)}
        if peers.fits(x):  # on two ranks the kernel pushes its blocks into the peer's slot, or leaves them for it
            pushes = (True, False) if tp.size == 2 else (False,)
            ways.update({f"one-shot{' pushed' if push else ''}": (peers.all_reduce, push) for push in pushes})
        for name, (reduce, push) in ways.items():
            all_reduce.PUSH_TWO_RANKS = bool(push)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(CALLS):
                    reduce(x)
            ms = _time_graph(graph, REPLAYS)
            if tp.rank == 0:
                print(f"ranks {tp.size}, [{count}, {hidden}] bf16, {name}: {ms * 1000 / CALLS:.1f} us per all-reduce "
                      f"({CALLS} in one graph; NCCL_PROTO={os.environ.get('NCCL_PROTO', '-')}, "
                      f"NCCL_ALGO={os.environ.get('NCCL_ALGO', '-')})", flush=True)
            del graph
    torch.cuda.synchronize()
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=5376)
    parser.add_argument("--rows", default="1,16,64")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    run_local(_rank, args.size, args.hidden, [int(r) for r in args.rows.split(",")], backend="nccl")


if __name__ == "__main__":
    main()
