"""AITER's custom all-reduce (its CustomAllreduce: IPC-shared buffers and HIP kernels that read the peers' memory
directly) for a tensor-parallel group on ROCm, in the forwards that make a decode graph; RCCL sums the rest.

CustomAllreduce exchanges its IPC handles over a CPU (gloo) group, so every rank makes one beside the group's RCCL
group. Inside its capture() block a captured all-reduce reads the graph's own input buffer; at the block's end the
ranks register those buffers with each other (a collective: every rank captures the same graphs). The warm-up
passes before a capture also run inside the block, where AITER returns zeros without communicating, as vLLM's
capture does. Its size check allows larger inputs than the buffers atomlite asks for (AITER_CUSTOM_AR_MAX_SIZE,
64 MiB by default), so atomlite bounds the rows it hands over itself.
"""
import torch
import torch.distributed as dist

from atomlite.distributed.parallel import CustomAllReduceUnavailable, TensorParallel, in_graph_steps
from atomlite.model_ops.aiter import detect, functions as F

BUFFER_BYTES = 16 << 20  # AITER's staging buffers; its two-stage kernel uses half of one for partial sums
MAX_BYTES = BUFFER_BYTES // 2
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES; it disables itself for others


class AiterAllReduce:
    """A tensor-parallel group's small all-reduces through AITER's CustomAllreduce; made by every rank together."""

    hands_over_rank_partials = False  # no atomlite kernel reads AITER's buffers: the residual update gets sums

    def __init__(self, tp: TensorParallel, device: torch.device):
        ranks = None if tp.group is None else dist.get_process_group_ranks(tp.group)
        self.cpu_group = dist.new_group(ranks, backend="gloo")
        self.comm = detect.resolve(F.CUSTOM_ALL_REDUCE)(group=self.cpu_group, device=device, max_size=BUFFER_BYTES)
        if self.comm.disabled:
            raise CustomAllReduceUnavailable("AITER's CustomAllreduce disabled itself (its log says why)")

    def describe(self) -> str:
        return f"AITER's custom all-reduce in decode graphs (up to {MAX_BYTES >> 20} MiB)"

    def serves(self, x: torch.Tensor) -> bool:
        """In the forwards that make a decode graph (distributed.parallel.graph_steps), rows that fit the buffers
        and AITER's own checks (a multiple of 16 bytes, weakly contiguous)."""
        return (in_graph_steps() and x.numel() * x.element_size() <= MAX_BYTES
                and self.comm.should_custom_ar(inp=x))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.custom_all_reduce(input=x)

    def hand_over(self, parts: tuple[torch.Tensor, ...]) -> None:
        return None

    def capture(self):
        """The block every decode graph of the group is captured in (with its warm-up passes)."""
        return self.comm.capture()

    def close(self) -> None:
        self.comm.close()
