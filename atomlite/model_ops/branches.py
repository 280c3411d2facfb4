"""Independent work of a layer run side by side on a GPU.

A MoE layer's routed experts wait on a chain of small latency-bound launches (router, top-k, pair sorting) while
its dense MLP only streams weights: on a second stream the chain overlaps the MLP instead of adding to it. A
captured graph records the fork and the join as edges, so replays overlap the same way. Likewise a weight can be
read into L2 while latency-bound launches (attention at batch 1) leave memory idle. Off the GPU, or while
torch.compile traces, the branches simply run one after the other.
"""
from typing import Callable

import torch

HIGH_PRIORITY = -1  # CUDA/HIP: the lower number runs first where both want the SMs; streams default to 0
_side_streams: dict[tuple[torch.device, int], torch.cuda.Stream] = {}


def _side_stream(device: torch.device, priority: int) -> torch.cuda.Stream:
    if (device, priority) not in _side_streams:
        _side_streams[device, priority] = torch.cuda.Stream(device, priority=priority)
    return _side_streams[device, priority]


def _on_gpu(device: torch.device) -> bool:
    return device.type == "cuda" and not torch.compiler.is_compiling()


def side_by_side(side: Callable[[], object], main: Callable[[], object], device: torch.device) -> tuple:
    """(side(), main()), side() launched on a second stream of device. Every tensor either branch reads must stay
    referenced by the caller until this returns: the join is what makes freeing it safe."""
    if not _on_gpu(device):
        return side(), main()
    current = torch.cuda.current_stream(device)
    stream = _side_stream(device, HIGH_PRIORITY)  # the side branch is the longer, latency-bound one
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        side_result = side()
    main_result = main()
    current.wait_stream(stream)
    return side_result, main_result


def while_prefetching(prefetch: Callable[[], None], work: Callable[[], object], device: torch.device) -> object:
    """work(), while prefetch() (an L2 prefetch of the weight the next GEMM reads) fills the multiprocessors work's
    launches leave: work runs on a second stream of higher priority. Returns once both are done. Off the GPU, work()
    alone."""
    if not _on_gpu(device):
        return work()
    result, _ = side_by_side(work, prefetch, device)
    return result
