"""The one-shot all-reduce over peer memory (tensor parallelism's decode all-reduce). In the interpreter: one rank's
kernel, its peer's buffer slot and flag set by hand, three calls (the slots alternate, the flags count the calls).
On two GPUs: ranks that map each other's buffers through IPC get the exact sum, eager and replayed from a graph."""
import pytest
import torch

from atomlite.model_ops.peer_memory import refusal
from atomlite.model_ops.triton.all_reduce import MAX_PROGRAMS, one_shot_all_reduce, programs_for

WORLD, SLOT = 2, 8192


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's test (CPU tensors); GPUs run the two-rank one")
def test_one_rank_sums_its_rows_with_the_peer_slot_of_each_call():
    generator = torch.Generator().manual_seed(0)
    buffers = [torch.zeros(2 * SLOT) for _ in range(WORLD)]
    pads = [torch.zeros(MAX_PROGRAMS, WORLD, dtype=torch.int64) for _ in range(WORLD)]
    epochs = torch.zeros(MAX_PROGRAMS, dtype=torch.int64)
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers])
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads])
    n = 5000  # three programs, the last one partial
    programs = programs_for(n)
    for call in (1, 2, 3):
        x, peer = torch.randn(n, generator=generator), torch.randn(n, generator=generator)
        slot = (call % 2) * SLOT
        buffers[1][slot:slot + n] = peer
        pads[0][:programs, 1] = call  # the peer reached this call's barrier
        mine = x.clone()
        one_shot_all_reduce(x, buffer_ptrs, pad_ptrs, epochs, SLOT, 0, WORLD)
        assert torch.equal(x, mine + peer)
        assert torch.equal(buffers[0][slot:slot + n], mine)  # what the peer reads
        assert (pads[1][:programs, 0] == call).all()  # the flag raised in the peer's pad
        assert (epochs[:programs] == call).all() and not epochs[programs:].any()


def test_the_one_shot_kernel_is_refused_where_it_cannot_run(monkeypatch):
    assert "ATOMLITE_ONE_SHOT_ALL_REDUCE=1 turns it on" in refusal(torch.device("cuda"), 2)
    monkeypatch.setenv("ATOMLITE_ONE_SHOT_ALL_REDUCE", "1")
    assert refusal(torch.device("cpu"), 2) == "no GPU"
    assert refusal(torch.device("cuda"), 9) == "more than 8 ranks" or torch.version.hip is not None


def _inputs(shape, call: int, world: int) -> list[torch.Tensor]:
    return [torch.randn(shape, generator=torch.Generator().manual_seed(100 * call + r)).to(torch.bfloat16)
            for r in range(world)]


def _check_rank(tp, shapes) -> None:
    from atomlite.model_ops.peer_memory import PeerMemory
    torch.cuda.set_device(tp.rank)
    device = torch.device("cuda", tp.rank)
    peers = PeerMemory(tp.rank, tp.size, device)
    for shape in shapes:
        for call in range(3):  # eager
            inputs = _inputs(shape, call, tp.size)
            x = inputs[tp.rank].to(device)
            peers.all_reduce(x)
            want = torch.stack(inputs).float().sum(0).to(torch.bfloat16)
            assert torch.equal(x.cpu(), want), (shape, call)
        static = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            peers.all_reduce(static)
        for call in range(3, 8):  # replays: the epochs and slots move on inside the graph
            inputs = _inputs(shape, call, tp.size)
            static.copy_(inputs[tp.rank])
            graph.replay()
            want = torch.stack(inputs).float().sum(0).to(torch.bfloat16)
            assert torch.equal(static.cpu(), want), (shape, call)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_two_gpus_sum_exactly_eager_and_from_a_graph():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from atomlite.distributed.local import run_local
    run_local(_check_rank, 2, [(1, 5376), (64, 5376), (3, 1000)], backend="nccl")


def test_dispatch_gives_the_one_shot_kernel_to_nvidia_and_says_why_not_to_rocm():
    from atomlite.model_ops import dispatch
    from atomlite.model_ops.platform import parse_platform
    assert dispatch.choose("one_shot_all_reduce", parse_platform("sm_90"), world=2).fn is one_shot_all_reduce
    with pytest.raises(dispatch.NoKernel, match="not verified on ROCm"):
        dispatch.choose("one_shot_all_reduce", parse_platform("gfx942"), world=2)
