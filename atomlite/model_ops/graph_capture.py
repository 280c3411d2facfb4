"""One CUDA/HIP graph per bucket size, largest first, all in one memory pool: how decode steps and the vision and audio
towers are captured. Each bucket's forward runs twice before its capture, so every kernel variant at that shape is
compiled and loaded outside it."""
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


def bucket_sizes(largest: int, small: tuple[int, ...], step: int) -> list[int]:
    """The graphs' sizes: those of `small` below largest, then the multiples of step past small's last, then largest
    itself."""
    sizes = [b for b in small if b < largest]
    sizes += range(step * (small[-1] // step + 1), largest, step)
    return sizes + [largest]


@dataclass
class CaptureReport:
    what: str  # "decode graphs", "vision tower graphs"
    sizes: list[int]
    seconds: float
    graph_bytes: int  # what torch's allocator reserves more after the captures (the graphs' pool), not free memory
    sizes_are: str = "sizes"
    unit: str = ""

    def describe(self) -> str:
        return (f"{self.what}: {len(self.sizes)} {self.sizes_are} ({', '.join(map(str, self.sizes))}{self.unit}) "
                f"captured in {self.seconds:.1f} s, {self.graph_bytes / 2**20:.0f} MiB of graph memory")


@dataclass
class CapturedGraphs:
    graphs: dict[int, torch.cuda.CUDAGraph]
    sizes: list[int]
    seconds: float
    graph_bytes: int

    def report(self, what: str, sizes_are: str = "sizes", unit: str = "") -> CaptureReport:
        return CaptureReport(what, self.sizes, self.seconds, self.graph_bytes, sizes_are, unit)


@torch.inference_mode()
def capture_buckets(device: torch.device, sizes: list[int], forward: Callable[[int], object],
                    prepare: Callable[[int], None] = lambda bucket: None,
                    steps: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                    progress: Callable[[list[int]], Iterable[int]] = iter) -> CapturedGraphs:
    """prepare(bucket) fills the static inputs a bucket's forward reads; forward(bucket) is what its graph records;
    steps() wraps each bucket's warm-up passes and capture; progress wraps the buckets (a progress bar)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # as each capture does: both readings then hold no released-later cached blocks
    reserved_before = torch.cuda.memory_reserved(device)
    start, pool, graphs = time.perf_counter(), None, {}
    for bucket in progress(list(reversed(sizes))):
        prepare(bucket)
        graph = torch.cuda.CUDAGraph()
        with steps():
            for _ in range(2):
                forward(bucket)
            torch.cuda.synchronize(device)
            with torch.cuda.graph(graph, pool=pool):
                forward(bucket)
        pool = graph.pool()
        graphs[bucket] = graph
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return CapturedGraphs(graphs, list(sizes), time.perf_counter() - start,
                          torch.cuda.memory_reserved(device) - reserved_before)
