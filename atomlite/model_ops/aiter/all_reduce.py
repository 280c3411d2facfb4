"""AITER's custom all-reduce (its CustomAllreduce: IPC-shared buffers and HIP kernels that read the peers' memory
directly) for a tensor-parallel group on ROCm, in the forwards that make a decode graph; RCCL sums the rest.

CustomAllreduce exchanges its IPC handles over a CPU (gloo) group, so every rank makes one beside the group's RCCL
group. Inside its capture() block a captured all-reduce reads the graph's own input buffer; at the block's end the
ranks register those buffers with each other (a collective: every rank captures the same graphs). The warm-up
passes before a capture also run inside the block, where AITER returns zeros without communicating, as vLLM's
capture does. Newer AITERs check inputs against AITER_CUSTOM_AR_MAX_SIZE (64 MiB by default), not against the
buffers atomlite asks for, so atomlite bounds the rows it hands over itself.
"""
from datetime import timedelta

import torch
import torch.distributed as dist

from atomlite.distributed.parallel import CustomAllReduceUnavailable, TensorParallel, in_graph_steps
from atomlite.model_ops.aiter import detect, functions as F
from atomlite.model_ops.kernels import declare

BUFFER_BYTES = 16 << 20  # CustomAllreduce's max_size: its staging buffers
MAX_BYTES = BUFFER_BYTES // 2  # newer AITERs take at most half of max_size where they may run two stages
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES; it disables itself for others
# The handle exchanges happen where every rank arrives together (startup, the end of a capture): a rank that never
# comes is an error, not a wait of the default group's 30 minutes.
EXCHANGE_TIMEOUT = timedelta(minutes=5)


def unavailable() -> str | None:
    """Why AITER's custom all-reduce cannot run on this machine's AITER, before any rank makes one: its library
    failed to load (AITER then disables every communicator before exchanging anything, so ranks that disagree
    would wait on each other)."""
    if not detect.resolve(F.CUSTOM_ALL_REDUCE_LOADED):
        return "AITER's custom all-reduce library did not load (its log says why)"
    return None


class AiterAllReduce:
    """A tensor-parallel group's small all-reduces through AITER's CustomAllreduce; made by every rank together."""

    hands_over_rank_partials = False  # no atomlite kernel reads AITER's buffers: the residual update gets sums

    def __init__(self, tp: TensorParallel, device: torch.device):
        ranks = None if tp.group is None else dist.get_process_group_ranks(tp.group)
        self.cpu_group = dist.new_group(ranks, backend="gloo", timeout=EXCHANGE_TIMEOUT)
        self.comm = detect.call(F.CUSTOM_ALL_REDUCE, group=self.cpu_group, device=device, max_size=BUFFER_BYTES)
        self.closed = False
        if self.comm.disabled:
            self.close()
            raise CustomAllReduceUnavailable("AITER's CustomAllreduce disabled itself (its log says why)")

    def describe(self) -> str:
        return f"AITER's custom all-reduce in graphs (up to {MAX_BYTES >> 20} MiB)"

    def serves(self, x: torch.Tensor) -> bool:
        """In the forwards that make a decode graph (distributed.parallel.graph_steps), rows that fit the buffers
        and AITER's own checks (a multiple of 16 bytes, weakly contiguous)."""
        return (not self.closed and in_graph_steps() and x.numel() * x.element_size() <= MAX_BYTES
                and self.comm.should_custom_ar(inp=x))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.custom_all_reduce(input=x)

    def serves_pair(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """AITER's all-reduce takes one tensor: a pair goes stacked (TensorParallel.all_reduced)."""
        return False

    def hand_over(self, parts: tuple[torch.Tensor, ...]) -> None:
        return None

    def capture(self):
        """The block every decode graph of the group is captured in (with its warm-up passes)."""
        return self.comm.capture()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.comm.close()
            dist.destroy_process_group(self.cpu_group)


def _refuses(platform, shape: dict) -> str | None:
    if shape.get("world") not in SUPPORTED_WORLD_SIZES:
        return (f"CustomAllreduce runs on {'/'.join(map(str, SUPPORTED_WORLD_SIZES))} ranks, not "
                f"{shape.get('world')}")
    return None


# a tensor-parallel group's small all-reduces (a communicator factory)
declare("custom_all_reduce", "aiter", AiterAllReduce, refuses=_refuses, probe=unavailable,
        requires=(F.CUSTOM_ALL_REDUCE, *F.CUSTOM_ALL_REDUCE_METHODS))
