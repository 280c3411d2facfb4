"""Buffers every rank of a tensor-parallel group can read: each rank allocates its own and shares it through the
GPU runtime's IPC (distributed.ipc), so the one-shot all-reduce kernel (model_ops.triton.all_reduce) sums
the ranks' rows without a collective library: a decode step's all-reduce of [batch, hidden] rows took about 15 us
through NCCL on two H100s (bench/all_reduce.py), a large share of a step that makes two per layer. On two ranks it
also sums a prefill graph's rows: [2048, 2816] bf16 took 46 us against NCCL's 68 on two H200s (bench/all_reduce.py);
each rank reads its peer's whole share once, as much as NCCL's ring moves. With more ranks it would read world - 1
shares against the ring's 2 (world - 1) / world, so large rows stay with the library there."""
import contextlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from atomlite.distributed.ipc import Runtime
from atomlite.distributed.parallel import CustomAllReduceUnavailable, TensorParallel, in_graph_steps
from atomlite.model_ops import dispatch
from atomlite.model_ops.carriers import PartialSums, RankPartials
from atomlite.model_ops.platform import detect_platform

MAX_BYTES = 1 << 20  # a buffer slot; larger all-reduces go through the collective library, except on two ranks:
TWO_RANK_MAX_BYTES = 32 << 20  # the all-reduce's slot on two ranks: 2048 rows of hidden 5376 in bf16 (prefill graphs)
MAX_RANKS = 8
MAX_SIGNALS = 512  # flags per rank: the most programs one call launches (each takes every MAX_SIGNALS-th block)
# A pair's second tensor starts at a multiple of this many elements in the slot: a whole number of rounds of the
# kernel's programs, so that each block of the slot is always exchanged by the same program (all_reduce.py checks).
# A 1 MiB slot (more than two ranks) holds no pair: the pair is stacked and summed as one tensor there.
PAIR_ALIGN = 1 << 20


def pair_offset(n: int) -> int:
    """Where a pair's second tensor of n elements starts in a buffer slot: the first multiple of PAIR_ALIGN from n."""
    return -(-n // PAIR_ALIGN) * PAIR_ALIGN


def plain_slot_bytes(size: int) -> int:
    """The all-reduce's buffer slot on a group of size ranks (the module's docstring says why two differ)."""
    return TWO_RANK_MAX_BYTES if size == 2 else MAX_BYTES


def row_slot_bytes(size: int) -> int:
    """The pushed row exchange's slot: 2 MiB from each rank (its words are twice a value's width), as many rows as
    a 1 MiB slot of plain values read by every rank held (48 rows of hidden 5376 in bf16)."""
    return size * 2 * MAX_BYTES


def refusal(device: torch.device, size: int, disabled: bool = False) -> str | None:
    """Why a group of `size` ranks on device reduces through nccl/gloo alone, before asking dispatch for a custom
    all-reduce; None when one may serve. disabled: --disable-custom-all-reduce."""
    if device.type != "cuda":
        return "no GPU"
    if disabled:
        return "--disable-custom-all-reduce"
    if size > MAX_RANKS:
        return f"more than {MAX_RANKS} ranks"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not all(torch.cuda.can_device_access_peer(index, peer) for peer in range(size) if peer != index):
        return "the GPUs cannot read each other's memory (no peer access)"
    return None


def with_custom_all_reduce(tp: TensorParallel, device: torch.device,
                           disabled: bool = False) -> tuple[TensorParallel, str]:
    """tp with the custom all-reduce dispatch chose for its small rows attached (op custom_all_reduce: AITER's on
    ROCm, the one-shot Triton kernel over peer memory on NVIDIA), and the startup line that says which all-reduce
    the group uses. Every rank calls this together; all get one or none does, or their calls would never pair.
    disabled: --disable-custom-all-reduce."""
    why, peers = refusal(device, tp.size, disabled), None
    if why is None:
        try:
            make = dispatch.choose("custom_all_reduce", world=tp.size).fn
        except dispatch.NoKernel as e:
            why = str(e)
    if not tp.min_over_ranks(why is None, device) and why is None:
        why = "another rank cannot use it"
    if why is None:
        try:
            peers = make(tp, device)
        except CustomAllReduceUnavailable as e:
            why = str(e)
        if not tp.min_over_ranks(why is None, device):
            if peers is not None:
                peers.close()
            peers, why = None, why or "another rank could not set it up"
    library = dist.get_backend(tp.group)
    if peers is None:
        return tp, f"all-reduce: {library} (no custom all-reduce: {why})"
    return replace(tp, peers=peers), f"all-reduce: {peers.describe()}, {library} otherwise"


@dataclass(frozen=True)
class PeerChannel:
    """The peer memory of one kind of exchanging kernel: every rank's buffer (two slots of slot_bytes) and signal pad
    addresses (int64 [world] device tensors) and this rank's call counters (int64 [MAX_SIGNALS], one a program).
    Each kind has its own: a kernel's program p reuses its buffer region and flag only after the peers' program p of
    the same kind has passed the call before. The row channel's kernel (all_reduce.peer_rows_sum) pushes: every
    rank writes its rows, tagged, into every peer's buffer and no flag is raised (slot_words, holds)."""
    buffers: torch.Tensor
    signals: torch.Tensor
    epochs: torch.Tensor
    rank: int
    world: int
    slot_bytes: int = MAX_BYTES

    def slot_elems(self, dtype: torch.dtype) -> int:
        return self.slot_bytes // dtype.itemsize

    def slot_words(self, dtype: torch.dtype) -> int:
        """A pushed slot's words: each holds a dtype value and its call's tag, twice dtype's width."""
        return self.slot_bytes // (2 * dtype.itemsize)

    def holds(self, rows: int, dim: int, element_size: int) -> bool:
        """Whether a pushed row exchange of rows (one program each; a region of two rows of dim words from each
        rank) fits."""
        return rows <= MAX_SIGNALS and rows * self.world * 2 * dim * 2 * element_size <= self.slot_bytes


class PeerMemory:
    """This rank's peer channels (the one-shot all-reduce's, and the one of the kernels that read RankPartials) and
    every rank's addresses of them. Built by every rank of the group together (it exchanges the IPC handles); held
    for the process's life."""

    hands_over_rank_partials = True  # the Triton residual update reads RankPartials from its row channel

    @classmethod
    def for_group(cls, tp: TensorParallel, device: torch.device) -> "PeerMemory":
        """Dispatch's custom_all_reduce on NVIDIA: every rank of tp builds its peer memory together."""
        return cls(tp.rank, tp.size, device, tp.group, dispatch.choose("one_shot_all_reduce", world=tp.size).fn)

    def __init__(self, rank: int, size: int, device: torch.device, group=None, kernel=None):
        """kernel: the one_shot_all_reduce op dispatch chose (default: the one it chooses for device)."""
        self.rank, self.size = rank, size
        self.kernel = kernel or dispatch.choose("one_shot_all_reduce", detect_platform(device), world=size).fn
        runtime = Runtime(device)
        self.plain = self._channel(runtime, device, group, plain_slot_bytes(size))
        self.rows = self._channel(runtime, device, group, row_slot_bytes(size))
        dist.barrier(group=group)  # every rank has mapped every buffer before any kernel raises a flag

    def _channel(self, runtime: Runtime, device: torch.device, group, slot_bytes: int) -> PeerChannel:
        pad_offset = 2 * slot_bytes
        with torch.cuda.device(device):
            own = runtime.malloc(pad_offset + MAX_SIGNALS * self.size * 8)  # zeroed: no flag is up
            shared = [None] * self.size
            dist.all_gather_object(shared, runtime.ipc_handle(own), group=group)
            bases = [own if r == self.rank else runtime.open_ipc_handle(handle) for r, handle in enumerate(shared)]
        return PeerChannel(torch.tensor(bases, dtype=torch.int64, device=device),
                           torch.tensor([base + pad_offset for base in bases], dtype=torch.int64, device=device),
                           torch.zeros(MAX_SIGNALS, dtype=torch.int64, device=device), self.rank, self.size,
                           slot_bytes)

    def describe(self) -> str:
        return (f"one-shot Triton kernel over peer memory in graphs (up to {self.plain.slot_bytes >> 20} MiB; summed "
                f"in the residual update where it reads the shares)")

    def capture(self):
        """Nothing to register: the kernels exchange through the buffers mapped at construction."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """The mapped buffers stay for the process's life (the runtime unmaps them at exit)."""

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_contiguous() and x.numel() * x.element_size() <= self.plain.slot_bytes

    def serves(self, x: torch.Tensor) -> bool:
        """Whether the one-shot kernel all-reduces x: it fits, in the forwards that make a graph
        (distributed.parallel.graph_steps: a decode step's collectives' latency is its time; an eager step's time
        is the host's)."""
        return in_graph_steps() and self.fits(x)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        c = self.plain
        return self.kernel(x, c.buffers, c.signals, c.epochs, c.slot_elems(x.dtype), self.rank, self.size)

    def serves_pair(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether the one-shot kernel all-reduces a and b (one shape and dtype) in one exchange, as serves does for
        one tensor: a MoE layer's two branches, which the library would take stacked (a copy of both)."""
        return (in_graph_steps() and a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous()
                and b.is_contiguous() and pair_offset(a.numel()) + a.numel() <= self.plain.slot_elems(a.dtype))

    def all_reduce_pair(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.plain
        return self.kernel(a, c.buffers, c.signals, c.epochs, c.slot_elems(a.dtype), self.rank, self.size, y=b)

    def takes_rank_partials(self, rows: int, dim: int, element_size: int) -> bool:
        """Whether hand_over takes shares of rows x dim (elements of element_size bytes): in the forwards that make a
        graph (as serves), at most MAX_SIGNALS rows and MAX_BYTES for two such rows."""
        return in_graph_steps() and self.rows.holds(rows, dim, element_size)

    def hand_over(self, parts: tuple) -> tuple[RankPartials, ...] | None:
        """parts (one or two [rows, dim] shares of the same shape, each a tensor or a split-K GEMM's PartialSums) as
        RankPartials for a reading kernel to sum, where takes_rank_partials says so; else None (all-reduce them)."""
        if not all(_row_major(p) for p in parts):
            return None
        share = parts[0].parts[0] if isinstance(parts[0], PartialSums) else parts[0]
        rows, dim = share.numel() // share.shape[-1], share.shape[-1]
        if not self.takes_rank_partials(rows, dim, parts[0].dtype.itemsize):
            return None
        return tuple(RankPartials(p, self.rows) for p in parts)


def _row_major(share) -> bool:
    """A share as the reading kernel takes it: a contiguous tensor, or PartialSums [slices, rows, dim] with unit
    stride along dim."""
    if isinstance(share, PartialSums):
        return share.parts.dim() == 3 and share.parts.stride(-1) == 1
    return share.is_contiguous()
