"""Buffers every rank of a tensor-parallel group can read: each rank allocates its own and shares it through the
GPU runtime's IPC (distributed.ipc), so the one-shot all-reduce kernel (model_ops.triton.all_reduce) sums
the ranks' rows without a collective library: a decode step's all-reduce of [batch, hidden] rows took about 15 us
through NCCL on two H100s (bench/all_reduce.py), a large share of a step that makes two per layer."""
import os
from dataclasses import replace

import torch
import torch.distributed as dist

from atomlite.distributed.ipc import Runtime
from atomlite.distributed.parallel import TensorParallel
from atomlite.model_ops import dispatch
from atomlite.model_ops.platform import detect_platform

MAX_BYTES = 1 << 20  # larger all-reduces (prefill) go through the collective library, which has the bandwidth
MAX_RANKS = 8
MAX_SIGNALS = 512  # flags per rank: the most programs one call launches (the kernel's BLOCK elements each)


def refusal(device: torch.device, size: int) -> str | None:
    """Why a group of `size` ranks on device reduces through nccl/gloo instead; None when the one-shot kernel
    serves its small all-reduces."""
    if device.type != "cuda":
        return "no GPU"
    if os.environ.get("ATOMLITE_ONE_SHOT_ALL_REDUCE", "0") != "1":
        return "the one-shot kernel is off until checked on GPUs; ATOMLITE_ONE_SHOT_ALL_REDUCE=1 turns it on"
    if size > MAX_RANKS:
        return f"more than {MAX_RANKS} ranks"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not all(torch.cuda.can_device_access_peer(index, peer) for peer in range(size) if peer != index):
        return "the GPUs cannot read each other's memory (no peer access)"
    return None


def with_peer_memory(tp: TensorParallel, device: torch.device) -> tuple[TensorParallel, str]:
    """tp with the one-shot all-reduce attached where it can run (every rank calls this together), and the startup
    line that says which all-reduce the group uses."""
    why, kernel = refusal(device, tp.size), None
    if why is None:
        try:
            kernel = dispatch.choose("one_shot_all_reduce", world=tp.size).fn
        except dispatch.NoKernel as e:
            why = str(e)
    if not tp.min_over_ranks(why is None, device) and why is None:
        why = "another rank cannot use the one-shot kernel"  # all ranks reduce one way, or their calls never pair
    if why is not None:
        return tp, f"all-reduce: {dist.get_backend(tp.group)} ({why})"
    peers = PeerMemory(tp.rank, tp.size, device, tp.group, kernel)
    return replace(tp, peers=peers), (f"all-reduce: one-shot Triton kernel over peer memory up to "
                                      f"{MAX_BYTES >> 10} KiB (decode steps), {dist.get_backend(tp.group)} beyond")


class PeerMemory:
    """This rank's buffer (two slots of MAX_BYTES) and signal pad, in one allocation, and every rank's addresses of
    them. Built by every rank of the group together (it exchanges the IPC handles); held for the process's life."""

    def __init__(self, rank: int, size: int, device: torch.device, group=None, kernel=None):
        """kernel: the one_shot_all_reduce op dispatch chose (default: the one it chooses for device)."""
        self.rank, self.size = rank, size
        self.kernel = kernel or dispatch.choose("one_shot_all_reduce", detect_platform(device), world=size).fn
        runtime = Runtime(device)
        pad_offset = 2 * MAX_BYTES
        with torch.cuda.device(device):
            own = runtime.malloc(pad_offset + MAX_SIGNALS * size * 8)  # zeroed: no flag is up
            shared = [None] * size
            dist.all_gather_object(shared, runtime.ipc_handle(own), group=group)
            bases = [own if r == rank else runtime.open_ipc_handle(handle) for r, handle in enumerate(shared)]
        self.buffers = torch.tensor(bases, dtype=torch.int64, device=device)
        self.signals = torch.tensor([base + pad_offset for base in bases], dtype=torch.int64, device=device)
        self.epochs = torch.zeros(MAX_SIGNALS, dtype=torch.int64, device=device)
        dist.barrier(group=group)  # every rank has mapped every buffer before any kernel raises a flag

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_contiguous() and x.numel() * x.element_size() <= MAX_BYTES

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.buffers, self.signals, self.epochs, MAX_BYTES // x.element_size(), self.rank,
                           self.size)
