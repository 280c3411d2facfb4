"""Weight slabs for the large-M MXFP4 paths: slabs of weight rows expanded into one of two buffers, on a side
stream on a GPU, so that the next slab is expanded (a memory-bound pass) while the vendor GEMM of this one runs
(compute-bound); the first one while x is quantized."""
import functools
from collections.abc import Callable
from typing import Any

import torch


@functools.cache
def _side_stream(device_index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device_index)


class SlabExpander:
    """launch(buffer, first, count) expands weight rows [first, first + count) into one of the buffers."""

    def __init__(self, x: torch.Tensor, buffers: list[Any], launch: Callable[[Any, int, int], None]):
        self.buffers, self.launch = buffers, launch
        self.main = torch.cuda.current_stream(x.device) if x.is_cuda else None
        self.side = _side_stream(self.main.device.index) if x.is_cuda else None
        self.used = [None] * len(buffers)  # per buffer: the main stream's event after its last GEMM
        self.ready = [None] * len(buffers)  # per buffer: the side stream's event after its expansion
        if self.side is not None:
            self.side.wait_stream(self.main)  # weight and x are written on the main stream

    def expand(self, index: int, first: int, count: int) -> None:
        slot = index % len(self.buffers)
        if self.side is None:
            self.launch(self.buffers[slot], first, count)
            return
        with torch.cuda.stream(self.side):
            if self.used[slot] is not None:
                self.side.wait_event(self.used[slot])
            self.launch(self.buffers[slot], first, count)
            self.ready[slot] = torch.cuda.Event()
            self.ready[slot].record(self.side)

    def acquire(self, index: int) -> Any:
        """The buffer of expand(index), once expanded (the main stream waits for it)."""
        slot = index % len(self.buffers)
        if self.side is not None:
            self.main.wait_event(self.ready[slot])
        return self.buffers[slot]

    def release(self, index: int) -> None:
        """The main stream's work on this buffer is queued: the side stream may overwrite it after that."""
        if self.main is not None:
            self.used[index % len(self.buffers)] = torch.cuda.Event()
            self.used[index % len(self.buffers)].record(self.main)


def slab_firsts(n: int, rows: int) -> list[tuple[int, int]]:
    """(first row, row count) of each slab of `rows` rows over n weight rows."""
    return [(first, min(rows, n - first)) for first in range(0, n, rows)]


def matmul_by_slabs(x: torch.Tensor, n: int, rows: int, allocate: Callable[[int], Any],
                    launch: Callable[[Any, int, int], None], prepare_x: Callable[[], Any],
                    multiply: Callable[[Any, Any, int, torch.Tensor], None], out: torch.Tensor) -> torch.Tensor:
    """out[:, first:first + count] = multiply(prepared x, slab buffer, count, that output view) slab by slab; the
    first slab's expansion is queued before prepare_x (x's quantization) so that the two overlap."""
    slabs = slab_firsts(n, rows)
    expander = SlabExpander(x, [allocate(min(rows, n)) for _ in range(min(2, len(slabs)))], launch)
    expander.expand(0, *slabs[0])
    prepared = prepare_x()
    for index, (first, count) in enumerate(slabs):
        if index + 1 < len(slabs):
            expander.expand(index + 1, *slabs[index + 1])
        multiply(prepared, expander.acquire(index), count, out[:, first:first + count])
        expander.release(index)
    return out
