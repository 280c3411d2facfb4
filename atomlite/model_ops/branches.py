"""Two independent branches of a layer run side by side on a GPU.

At decode a MoE layer's routed experts are a chain of dependent launches (gate_up, then down, each waiting on the
one before) while its dense MLP only streams weights: on a second stream the chain overlaps the MLP instead of
adding to it. At a prefill the experts are bound by their weight reads and the dense MLP by its multiplies, so
they overlap too. A captured graph records the fork and the join as edges, so replays overlap the same way. Off the
GPU, while torch.compile traces, or where the caller says not to overlap, the branches simply run one after the
other.
"""
from typing import Callable

import torch

OVERLAP_MAX_ROWS = 16  # beyond decode-sized batches each branch fills the GPU by itself
# From this many rows (a prefill) the experts, bound by their weight reads, overlap the dense MLP's tensor-core GEMMs:
# 26B-A4B TTFT of 2040 tokens 37.77 -> 37.30 ms, of 512 19.05 -> 18.76 (H200, bench latency, one call; bench/README).
# Between the two bounds nothing was measured, so the branches run one after the other there.
OVERLAP_MIN_PREFILL_ROWS = 512


def overlaps(rows: int) -> bool:
    """Whether a layer's two branches run side by side at a step of this many rows."""
    return rows <= OVERLAP_MAX_ROWS or rows >= OVERLAP_MIN_PREFILL_ROWS


_side_streams: dict[tuple[torch.device, str], torch.cuda.Stream] = {}


def _side_stream(device: torch.device, lane: str) -> torch.cuda.Stream:
    if (device, lane) not in _side_streams:
        # at decode the branch on it is the shorter, latency-bound one: ahead of the other where both want the SMs
        _side_streams[device, lane] = torch.cuda.Stream(device, priority=-1)
    return _side_streams[device, lane]


def side_by_side(side: Callable[[], object], main: Callable[[], object], device: torch.device,
                 overlap: bool = True, lane: str = "layer") -> tuple:
    """(side(), main()), side() launched on a second stream of device where overlap holds (the caller's call: for
    a decode-sized batch). Every tensor either branch reads must stay referenced by the caller until this returns:
    the join is what makes freeing it safe. lane names the second stream: a fork inside another fork's main branch
    takes a lane of its own, or it would queue behind (and join) the outer side branch."""
    if not overlap or device.type != "cuda" or torch.compiler.is_compiling():
        return side(), main()
    current = torch.cuda.current_stream(device)
    stream = _side_stream(device, lane)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        side_result = side()
    main_result = main()
    current.wait_stream(stream)
    return side_result, main_result
