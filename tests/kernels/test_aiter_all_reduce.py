"""A tensor-parallel group's small all-reduces on ROCm go through AITER's CustomAllreduce where dispatch picks it.

AITER cannot run here (shared/docs/AITER.md), so these tests use test_aiter_contract's stand-in `aiter`, built from
the pinned signatures, whose CustomAllreduce sums over the group's gloo ranks as AITER documents its HIP kernels to
(test_aiter_semantics.py): what is checked is the dispatch, the adapter's bounds and calls, and that a model's
all-reduces through it give the single-process logits. No AITER kernel runs."""
import pytest
import torch

from atomlite import distributed
from atomlite.distributed.local import run_local
from atomlite.distributed.parallel import graph_steps
from atomlite.model_ops import dispatch, peer_memory
from atomlite.model_ops.aiter import detect, functions as F
from atomlite.model_ops.aiter.all_reduce import MAX_BYTES, AiterAllReduce
from atomlite.model_ops.peer_memory import PeerMemory, with_custom_all_reduce
from atomlite.model_ops.platform import Platform
from helpers import random_prompt
from tensor_parallel_run import build, greedy_logits
from test_aiter_contract import install_stand_in, one_rank_group

GFX942 = Platform("rocm", "gfx942", has_aiter=True)
STEPS = 3
PROMPT = random_prompt(9, seed=3)


@pytest.mark.parametrize("platform,world,backend", [(GFX942, 2, "aiter"), (Platform("rocm", "gfx950", True), 8, "aiter"),
                                                    (Platform("cuda", "sm_90"), 2, "triton")])
def test_dispatch_picks_aiters_all_reduce_on_rocm_and_the_one_shot_kernel_on_nvidia(platform, world, backend):
    choice = dispatch.choose("custom_all_reduce", platform, world=world)
    assert choice.backend == backend
    assert choice.fn == (AiterAllReduce if backend == "aiter" else PeerMemory.for_group)


@pytest.mark.parametrize("platform,world,reasons", [
    (GFX942, 3, ["aiter: CustomAllreduce runs on 2/4/6/8 ranks, not 3", "triton: not verified on ROCm"]),
    (Platform("rocm", "gfx942", has_aiter=False), 2, ["triton: not verified on ROCm", "torch: no reference"]),
    (Platform("cpu"), 2, ["torch: no reference: the group's collective library (nccl, gloo) sums instead"]),
])
def test_where_no_custom_all_reduce_serves_dispatch_says_why(platform, world, reasons):
    with pytest.raises(dispatch.NoKernel) as refused:
        dispatch.choose("custom_all_reduce", platform, world=world)
    assert all(reason in str(refused.value) for reason in reasons)


@pytest.fixture(params=sorted(detect.pinned()))
def stand_in(request, monkeypatch):
    return install_stand_in(monkeypatch, detect.pinned()[request.param]["functions"])


def test_rows_go_to_aiter_only_in_graph_steps_and_within_the_adapters_own_bound(stand_in):
    """AITER's own check takes rows up to 64 MiB, more than the buffers atomlite asks it for."""
    rows = torch.zeros(4, 64, dtype=torch.bfloat16)
    too_large = torch.zeros(MAX_BYTES // 2 + 8, dtype=torch.bfloat16)
    with one_rank_group():
        comm = AiterAllReduce(distributed.TensorParallel(0, 1), torch.device("cpu"))
        outside = comm.serves(rows)
        with graph_steps():
            inside = [comm.serves(rows), comm.serves(too_large), comm.serves(rows[:, :3])]
        comm.close()
    assert not outside and inside == [True, False, False]
    assert comm.comm.should_custom_ar(inp=too_large)  # AITER would have taken it
    assert comm.comm.closed and not comm.hands_over_rank_partials


def test_the_group_captures_inside_aiters_capture_block(stand_in):
    """capturing() is AITER's capture(): the captured buffers are registered once the block ends."""
    with one_rank_group():
        tp = distributed.TensorParallel(0, 1, peers=AiterAllReduce(distributed.TensorParallel(0, 1),
                                                                   torch.device("cpu")))
        with tp.capturing():
            assert tp.peers.comm.capturing
        assert tp.peers.comm.registrations == 1
        tp.close_peers()
    assert [path for path, _, _ in stand_in].count(F.CUSTOM_ALL_REDUCE_METHODS[0]) == 1


class _Patch:
    """monkeypatch.setitem for a spawned rank, whose process ends with the test."""

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def run_rank_through_aiter(tp, cases: dict, prompt: list[int], steps: int, out) -> None:
    """A rank that stands for a ROCm GPU with AITER: dispatch attaches the stand-in's CustomAllreduce to the group,
    then each case's prefill and decode steps run as the forwards of a decode graph, so every all-reduce goes
    through it."""
    calls = install_stand_in(_Patch(), detect.pinned()[detect.ASSUMED_VERSION]["functions"])
    peer_memory.refusal = lambda *args: None  # a CPU rank: let dispatch decide as on a GPU
    with dispatch.use(GFX942):
        tp, note = with_custom_all_reduce(tp, torch.device("cpu"))
    logits = {}
    for case, path in cases.items():
        model = build(path, tp)
        with graph_steps():
            logits[case] = greedy_logits(model, prompt, steps)
    reduced = sum(path == F.CUSTOM_ALL_REDUCE_METHODS[2] for path, _, _ in calls)
    if tp.rank == 0:
        torch.save({"logits": logits, "note": note, "reduced": reduced}, out)


def test_two_ranks_reducing_through_aiter_give_the_single_process_logits(checkpoints, tmp_path):
    cases = {"dense": checkpoints.get("dense")[0], "moe": checkpoints.get("moe")[0]}
    run_local(run_rank_through_aiter, 2, cases, PROMPT, STEPS, tmp_path / "rank0.pt")
    got = torch.load(tmp_path / "rank0.pt")
    assert got["note"].startswith("all-reduce: AITER's custom all-reduce in decode graphs")
    assert got["reduced"] > 0
    for case, path in cases.items():
        single = greedy_logits(build(path, distributed.TensorParallel()), PROMPT, STEPS)
        sharded = got["logits"][case]
        assert sharded.argmax(-1).tolist() == single.argmax(-1).tolist(), case
        torch.testing.assert_close(torch.log_softmax(sharded, -1), torch.log_softmax(single, -1), rtol=0, atol=1e-4)
