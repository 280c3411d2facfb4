"""A tensor-parallel group's small all-reduces on ROCm go through AITER's CustomAllreduce where dispatch picks it.

AITER cannot run here (shared/docs/AITER.md), so these tests use test_aiter_contract's stand-in `aiter`, built from
the pinned signatures, whose CustomAllreduce sums over the group's gloo ranks as AITER documents its HIP kernels to
(test_aiter_semantics.py), and disables itself where AITER's does: what is checked is the dispatch, the adapter's
bounds and calls, and that a model's all-reduces through it give the single-process logits. No AITER kernel runs."""
import contextlib

import pytest
import torch

from atomlite import distributed
from atomlite.distributed.local import run_local
from atomlite.distributed.parallel import graph_steps
from atomlite.model_ops import dispatch, peer_memory
from atomlite.model_ops.aiter import detect, functions as F
from atomlite.model_ops.aiter.all_reduce import MAX_BYTES, AiterAllReduce, unavailable
from atomlite.model_ops.peer_memory import PeerMemory, with_custom_all_reduce
from atomlite.model_ops.platform import Platform
from helpers import random_prompt
from tensor_parallel_run import build, greedy_logits
from test_aiter_contract import SpawnedPatch, install_stand_in

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


@pytest.mark.parametrize("loaded", [True, False])
def test_an_aiter_whose_all_reduce_library_did_not_load_is_refused_before_any_rank_makes_one(monkeypatch, loaded):
    install_stand_in(monkeypatch, detect.pinned()[detect.ASSUMED_VERSION]["functions"], all_reduce_loaded=loaded)
    assert unavailable() == (None if loaded else "AITER's custom all-reduce library did not load (its log says why)")


def observe_rank(tp, version: str, loaded: bool, cases: dict, prompt: list[int], steps: int, out) -> None:
    """A rank that stands for a ROCm GPU with AITER (the stand-in of `version`): dispatch attaches the group's
    custom all-reduce; then its bounds, its capture block, and each case's prefill and decode steps run as the
    forwards of a decode graph, so that every all-reduce goes through it. Rank 0 saves what it saw."""
    calls = install_stand_in(SpawnedPatch(), detect.pinned()[version]["functions"], all_reduce_loaded=loaded)
    peer_memory.refusal = lambda *args: None  # a CPU rank: let dispatch decide as on a GPU
    with dispatch.use(GFX942):
        tp, note = with_custom_all_reduce(tp, torch.device("cpu"))
    seen = {"note": note, "attached": tp.peers is not None}
    if tp.peers is not None:
        seen.update(bounds(tp.peers), logits={})
        with tp.capturing():
            seen["capturing"] = tp.peers.comm.capturing
        seen["registrations"] = tp.peers.comm.registrations
        for case, path in cases.items():
            with graph_steps():
                seen["logits"][case] = greedy_logits(build(path, tp), prompt, steps)
        seen["reduced"] = sum(path == F.CUSTOM_ALL_REDUCE_METHODS[2] for path, _, _ in calls)
        tp.close_peers()
        seen["closed"] = tp.peers.comm.closed and not tp.peers.serves(torch.zeros(8, dtype=torch.bfloat16))
    if tp.rank == 0:
        torch.save(seen, out)


def bounds(comm: AiterAllReduce) -> dict:
    rows = torch.zeros(4, 64, dtype=torch.bfloat16)
    too_large = torch.zeros(MAX_BYTES // 2 + 8, dtype=torch.bfloat16)  # AITER's own check takes it
    with graph_steps():
        inside = {"rows": comm.serves(rows), "too large": comm.serves(too_large),
                  "strided 16-byte rows": comm.serves(rows[:, :8]), "odd bytes": comm.serves(rows[0, :3])}
    return {"outside graph steps": comm.serves(rows), "inside": inside,
            "aiter takes too large": comm.comm.should_custom_ar(inp=too_large)}


@pytest.fixture(scope="module", params=sorted(detect.pinned()))
def two_ranks(request, checkpoints, tmp_path_factory) -> tuple[dict, dict]:
    cases = {"dense": checkpoints.get("dense")[0], "moe": checkpoints.get("moe")[0]}
    out = tmp_path_factory.mktemp("aiter-ar") / "rank0.pt"
    run_local(observe_rank, 2, request.param, True, cases, PROMPT, STEPS, out)
    return cases, torch.load(out)


def test_the_group_attaches_aiters_all_reduce_and_says_so(two_ranks):
    seen = two_ranks[1]
    assert seen["attached"]
    assert seen["note"] == "all-reduce: AITER's custom all-reduce in graphs (up to 8 MiB), gloo otherwise"


def test_rows_go_to_aiter_only_in_graph_steps_and_within_the_adapters_own_bound(two_ranks):
    seen = two_ranks[1]
    assert not seen["outside graph steps"] and seen["aiter takes too large"]
    assert seen["inside"] == {"rows": True, "too large": False, "strided 16-byte rows": False, "odd bytes": False}


def test_graphs_are_captured_inside_aiters_capture_block_and_closing_ends_its_service(two_ranks):
    seen = two_ranks[1]
    assert seen["capturing"] and seen["registrations"] == 1 and seen["closed"]


def test_two_ranks_reducing_through_aiter_give_the_single_process_logits(two_ranks):
    cases, seen = two_ranks
    assert seen["reduced"] > 0
    for case, path in cases.items():
        single = greedy_logits(build(path, distributed.TensorParallel()), PROMPT, STEPS)
        sharded = seen["logits"][case]
        assert sharded.argmax(-1).tolist() == single.argmax(-1).tolist(), case
        torch.testing.assert_close(torch.log_softmax(sharded, -1), torch.log_softmax(single, -1), rtol=0, atol=1e-4)


def test_a_communicator_aiter_disables_leaves_every_rank_on_the_collective_library(tmp_path):
    out = tmp_path / "rank0.pt"
    run_local(observe_rank, 2, detect.ASSUMED_VERSION, False, {}, PROMPT, STEPS, out)
    seen = torch.load(out)
    assert not seen["attached"]
    assert seen["note"] == ("all-reduce: gloo (no custom all-reduce: AITER's CustomAllreduce disabled itself (its "
                            "log says why))")


class _FakePeers:
    """Records whether a capture ran inside its block, and its close."""
    hands_over_rank_partials = False

    def __init__(self):
        self.inside, self.captured_inside, self.closed = False, [], False

    @contextlib.contextmanager
    def capture(self):
        self.inside = True
        yield
        self.inside = False

    def close(self):
        self.closed = True


def test_the_runner_captures_decode_and_verify_graphs_inside_the_groups_block_and_closes_it_last(checkpoints,
                                                                                              monkeypatch):
    from atomlite.engine.runner.decode_graphs import DecodeGraphs
    from atomlite.engine.kv.kv_cache import KVCacheManager, group_specs
    from atomlite.engine.runner.model_runner import ModelRunner
    peers = _FakePeers()
    monkeypatch.setattr(DecodeGraphs, "capture_all", lambda graphs: peers.captured_inside.append(peers.inside))
    model = build(checkpoints.get("dense")[0], distributed.TensorParallel())
    specs = model.kv_specs(torch.float32)
    kv = KVCacheManager(specs, 16 * len(group_specs(specs)[0]), 4, torch.device("cpu"), False)
    runner = ModelRunner(model, kv, torch.device("cpu"), distributed.TensorParallel(0, 2, peers=peers))
    runner.use_decode_graphs(2, 64)
    runner.use_verify_graphs(2, 2, 64)
    assert peers.captured_inside == [True, True] and not peers.closed
    runner.release_graphs()
    assert peers.closed
