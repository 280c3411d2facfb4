"""What a tensor-parallel layer adds to its single-process class: its output all-reduced, and its checkpoint tensors
read narrowed to the rank's shard.

A row-parallel layer (o_proj, down_proj, the experts) holds a slice of its input dim, so each rank's output is a
partial sum that the all-reduce completes; it must not hand on PartialSums to a fused consumer (model_ops.fusion),
since those would skip the all-reduce: it declares writes_partial_sums only where it hands on RankPartials, which
the consumer's kernel sums over the ranks, and then its PartialSums go only inside them.

The loader reads a parameter that has a read_shard(sliced, part) attribute through it, sliced being the checkpoint
tensor (a safetensors slice, or a tensor), so a rank reads only the rows or columns it keeps.
"""
import torch

from atomlite.distributed import Shard, TensorParallel
from atomlite.model_ops.carriers import summed

PARTIAL_OUTPUT = "writes_partial_sums"
RANK_PARTIALS = "rank_partials"


class ReducesOutput:
    """Mixin before a layer class: forward's output is summed over the ranks of tp. Linked to a consumer whose kernel
    sums RankPartials itself (and where the group's custom all-reduce hands them over), it hands its share over as
    RankPartials instead, in the forwards that make graphs (reduced, distributed.parallel.graph_steps). Where that
    consumer also adds PartialSums, the share may stay a split-K GEMM's slices (or the experts' slots) inside the
    RankPartials: the consumer adds them, rounds the share as the summing kernel would, then sums over the ranks,
    and the summing launch is saved. Only for a call whose share the exchange takes (peers.takes_rank_partials): the
    slices are never all-reduced."""

    def __init__(self, *args, tp: TensorParallel, **kwargs):
        super().__init__(*args, **kwargs)
        self.tp = tp
        self.reduce_output = True  # False: the layer around it all-reduces this output together with another
        self.hands_rank_partials = False
        self.shares_partial_sums = False  # linked: a call the exchange takes returns its share as PartialSums

    def forward(self, *args):
        if self.shares_partial_sums:
            x = args[0]
            self.returns_partial_sums = (isinstance(x, torch.Tensor) and self.tp.peers.takes_rank_partials(
                x.numel() // x.shape[-1], self.out_features, x.element_size()))
        out = super().forward(*args)
        return reduced(self.tp, out, hand_over=self.hands_rank_partials)[0] if self.reduce_output else out

    def can(self, capability: str) -> bool:
        if capability == f"writes_{RANK_PARTIALS}":
            return self.tp.peers is not None and self.tp.peers.hands_over_rank_partials
        if capability == PARTIAL_OUTPUT:  # only inside RankPartials (link_consumer)
            return self.can(f"writes_{RANK_PARTIALS}") and super().can(capability)
        return super().can(capability)

    def link_consumer(self, consumer, forms: set[str]) -> None:
        self.hands_rank_partials = RANK_PARTIALS in forms
        self.shares_partial_sums = self.hands_rank_partials and "partial_sums" in forms
        super().link_consumer(consumer, forms - {RANK_PARTIALS, "partial_sums"})


def reduced(tp: TensorParallel, *shares, hand_over: bool = False) -> tuple:
    """Row-parallel shares (of one shape) each summed over the ranks of tp, in one collective; with hand_over, where
    the peer memory's exchange takes them (peers.hand_over), they come back as RankPartials for the kernel that
    reads them to sum (model_ops.carriers). A share left as PartialSums for a hand-over that did not take it is
    summed first."""
    if tp.size == 1:
        return shares
    if hand_over and tp.peers is not None:
        handed = tp.peers.hand_over(shares)
        if handed is not None:
            return handed
    return tp.all_reduced(*(summed(share) for share in shares))


def along(dim: int, shard: Shard) -> tuple[slice, ...]:
    return (slice(None),) * dim + (slice(shard.start, shard.stop),)


def read_narrowed(param: torch.nn.Parameter, dim: int, shards: Shard | list[Shard]) -> None:
    """param's checkpoint tensors are read narrowed on dim to shard (shards[part] for each part of a fused one)."""
    def read(sliced, part: int | None):
        shard = shards if isinstance(shards, Shard) else shards[part]
        return sliced[along(dim, shard)]
    param.read_shard = read





def read_stacked_experts(gate_up: torch.nn.Parameter, down: torch.nn.Parameter, part: Shard) -> None:
    """Float experts stored stacked: gate_up [E, 2I, H] keeps part of the gate rows and the same part of the up
    rows; down [E, H, I] keeps part of its columns."""
    def read_gate_up(sliced, _):
        up = Shard(part.total + part.start, part.size, 2 * part.total)
        return torch.cat([sliced[along(1, part)], sliced[along(1, up)]], dim=1)
    gate_up.read_shard = read_gate_up
    read_narrowed(down, 2, part)


def read_per_expert_mxfp4(gate_up: torch.nn.Parameter, gate_up_scale: torch.nn.Parameter,
                          down: torch.nn.Parameter, down_scale: torch.nn.Parameter, part: Shard, block: int,
                          what: str) -> None:
    """MXFP4 experts stored one tensor per expert and projection: gate and up [I, H/2] (scales [I, H/32]) keep
    part of their rows; down [H, I/2] (scales [H, I/32]) part of its packed columns and scale blocks."""
    scale_columns = part.in_blocks(block, what)
    for param in (gate_up, gate_up_scale):
        read_narrowed(param, 0, part)
    read_narrowed(down, 1, part.in_blocks(2, what))
    read_narrowed(down_scale, 1, scale_columns)
