"""The one-shot all-reduce over peer memory (tensor parallelism's decode all-reduce), alone and inside the residual
update that reads RankPartials. In the interpreter: one rank's kernel, its peer's buffer slot and flag set by hand,
calls that alternate the slots and count the flags. On two GPUs: ranks that map each other's buffers through IPC get
the exact sum, eager and replayed from a graph."""
import pytest
import torch

from atomlite.model_ops.peer_memory import pair_offset, refusal
from atomlite.model_ops.triton.all_reduce import MAX_PROGRAMS, one_shot_all_reduce, programs_for

WORLD, SLOT = 2, 8192


def _one_rank(max_programs: int, monkeypatch, seed: int, push: bool = False):
    """Rank 0 of WORLD in the interpreter: every rank's buffer (two slots of SLOT) and pad, its epochs, the address
    tensors the kernel reads; the kernel launching at most max_programs programs, pushing its blocks into the peer's
    slot or leaving them in its own for the peer to read."""
    from atomlite.model_ops.triton import all_reduce
    monkeypatch.setattr(all_reduce, "MAX_PROGRAMS", max_programs)
    monkeypatch.setattr(all_reduce, "PUSH_TWO_RANKS", push)
    buffers = [torch.zeros(2 * SLOT) for _ in range(WORLD)]
    pads = [torch.zeros(MAX_PROGRAMS, WORLD, dtype=torch.int64) for _ in range(WORLD)]
    epochs = torch.zeros(MAX_PROGRAMS, dtype=torch.int64)
    return (torch.Generator().manual_seed(seed), buffers, pads, epochs,
            torch.tensor([b.data_ptr() for b in buffers]), torch.tensor([p.data_ptr() for p in pads]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's test (CPU tensors); GPUs run the two-rank one")
@pytest.mark.parametrize("max_programs", [MAX_PROGRAMS, 2], ids=["a block each", "programs loop over blocks"])
@pytest.mark.parametrize("push", [True, False], ids=["pushed", "pulled"])
def test_one_rank_sums_its_rows_with_the_peer_slot_of_each_call(max_programs, push, monkeypatch):
    """Three blocks: one a program, or (a prefill's rows: more blocks than programs) two programs, the first taking
    blocks 0 and 2 under one flag. Pushed, the peer's blocks are in rank 0's slot and rank 0's go to the peer's;
    pulled, each rank's blocks stay in its own slot."""
    generator, buffers, pads, epochs, buffer_ptrs, pad_ptrs = _one_rank(max_programs, monkeypatch, 0, push)
    received, sent = (buffers[0], buffers[1]) if push else (buffers[1], buffers[0])
    n = 5000  # three blocks, the last one partial
    programs = programs_for(n)
    assert programs == min(3, max_programs)
    for call in (1, 2, 3):
        x, peer = torch.randn(n, generator=generator), torch.randn(n, generator=generator)
        slot = (call % 2) * SLOT
        received[slot:slot + n] = peer
        pads[0][:programs, 1] = call  # the peer reached this call's barrier
        mine = x.clone()
        one_shot_all_reduce(x, buffer_ptrs, pad_ptrs, epochs, SLOT, 0, WORLD)
        assert torch.equal(x, mine + peer)
        assert torch.equal(sent[slot:slot + n], mine)  # what the peer reads
        assert (pads[1][:programs, 0] == call).all()  # the flag raised in the peer's pad
        assert (epochs[:programs] == call).all() and not epochs[programs:].any()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's test (CPU tensors); GPUs run the two-rank one")
@pytest.mark.parametrize("max_programs", [2, 1], ids=["a block each", "one program loops over both"])
@pytest.mark.parametrize("push", [True, False], ids=["pushed", "pulled"])
def test_a_pair_is_summed_in_one_exchange_the_second_on_a_whole_round_of_programs(max_programs, push, monkeypatch):
    """A MoE layer's two branches (PeerMemory.all_reduce_pair): x's blocks, then y's from the first multiple of
    PAIR_ALIGN (here 4096, two blocks: a whole round of two programs), one flag a program; each comes back summed
    as it would alone. An alignment that is not a whole round of programs is refused."""
    from atomlite.model_ops import peer_memory
    monkeypatch.setattr(peer_memory, "PAIR_ALIGN", 4096)
    generator, buffers, pads, epochs, buffer_ptrs, pad_ptrs = _one_rank(max_programs, monkeypatch, 2, push)
    received, sent = (buffers[0], buffers[1]) if push else (buffers[1], buffers[0])
    n = 3000  # two blocks, the second partial; y from 4096
    programs = programs_for(n)
    for call in (1, 2):
        x, y, peer_x, peer_y = (torch.randn(n, generator=generator) for _ in range(4))
        slot = (call % 2) * SLOT
        received[slot:slot + n], received[slot + 4096:slot + 4096 + n] = peer_x, peer_y
        pads[0][:programs, 1] = call
        mine_x, mine_y = x.clone(), y.clone()
        got = one_shot_all_reduce(x, buffer_ptrs, pad_ptrs, epochs, SLOT, 0, WORLD, y=y)
        assert got[0] is x and got[1] is y
        assert torch.equal(x, mine_x + peer_x) and torch.equal(y, mine_y + peer_y)
        assert torch.equal(sent[slot:slot + n], mine_x)
        assert torch.equal(sent[slot + 4096:slot + 4096 + n], mine_y)
        assert (pads[1][:programs, 0] == call).all() and (epochs[:programs] == call).all()
    with pytest.raises(ValueError, match="exceed"):
        one_shot_all_reduce(torch.zeros(4097), buffer_ptrs, pad_ptrs, epochs, SLOT, 0, WORLD, y=torch.zeros(4097))
    monkeypatch.setattr(peer_memory, "PAIR_ALIGN", 1024)  # y at 3072: no whole round of one or two programs
    with pytest.raises(ValueError, match="whole round"):
        one_shot_all_reduce(torch.zeros(n), buffer_ptrs, pad_ptrs, epochs, SLOT, 0, WORLD, y=torch.zeros(n))


def _tagged(values: torch.Tensor, call: int) -> torch.Tensor:
    """fp32 values as the pushed row exchange writes them: int64 words, the value's bits low, the call's tag high."""
    return (values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | (call << 32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's test (CPU tensors); GPUs run the two-rank one")
@pytest.mark.parametrize("pair", [False, True], ids=["one branch", "normed pair"])
@pytest.mark.parametrize("slices", [1, 3], ids=["summed shares", "split-K slices"])
def test_the_residual_update_sums_rank_partials_with_the_rows_the_peer_pushed(pair, slices):
    """Rank 0 of two: the peer's tagged words are set by hand in rank 0's buffer (source 1's region of each row), and
    rank 0 pushes its own tagged rows into the peer's buffer; calls alternate the slots. A share may be a split-K
    GEMM's slices (PartialSums): added, then exchanged."""
    from atomlite.model_ops import torch_ref
    from atomlite.model_ops.carriers import NormedPair, PartialSums, RankPartials
    from atomlite.model_ops.peer_memory import MAX_SIGNALS, PeerChannel
    from atomlite.model_ops.triton.norm.residual import rms_norm_residual
    rows, dim, sides = 3, 40, 2 if pair else 1
    slot_bytes = rows * WORLD * 2 * dim * 8
    slot = slot_bytes // 8  # words (int64: an fp32 value and its tag)
    generator = torch.Generator().manual_seed(1)
    buffers = [torch.zeros(2 * slot, dtype=torch.int64) for _ in range(WORLD)]
    channel = PeerChannel(torch.tensor([b.data_ptr() for b in buffers]), torch.zeros(WORLD, dtype=torch.int64),
                          torch.zeros(MAX_SIGNALS, dtype=torch.int64), 0, WORLD, slot_bytes)
    assert channel.holds(rows, dim, 4) and not channel.holds(rows + 1, dim, 4)
    weight, next_weight, weight_a, weight_b = (torch.rand(dim, generator=generator) + 0.5 for _ in range(4))
    for call in (1, 2, 3):
        mine, peer = ([torch.randn(rows, dim, generator=generator) for _ in range(sides)] for _ in range(2))
        region = (call % 2) * slot
        for row in range(rows):
            received = region + (row * WORLD + 1) * 2 * dim  # source 1's region of the row: a side's, then b's
            for side, rows_of_side in enumerate(peer):
                buffers[0][received + side * dim:received + (side + 1) * dim] = _tagged(rows_of_side[row], call)
        residual = torch.randn(rows, dim, generator=generator)
        if slices > 1:  # the slices add up to the share, in slice order
            split = [torch.randn(slices, rows, dim, generator=generator) for _ in mine]
            mine = [s.sum(0) for s in split]
            shares = [RankPartials(PartialSums(s, torch.float32), channel) for s in split]
        else:
            shares = [RankPartials(m, channel) for m in mine]
        totals = [m + p for m, p in zip(mine, peer)]
        x, want_x = ((NormedPair(*shares, weight_a, weight_b), NormedPair(*totals, weight_a, weight_b)) if pair
                     else (shares[0], totals[0]))
        got = rms_norm_residual(x, residual, weight, 1e-6, None, next_weight)
        want = torch_ref.rms_norm_residual(want_x, residual, weight, 1e-6, None, next_weight)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        for row in range(rows):  # what rank 0 pushed: source 0's region of the row in the peer's buffer
            sent = region + row * WORLD * 2 * dim
            for side, rows_of_side in enumerate(mine):
                assert torch.equal(buffers[1][sent + side * dim:sent + (side + 1) * dim],
                                   _tagged(rows_of_side[row], call))
        assert (channel.epochs[:rows] == call).all() and not channel.epochs[rows:].any()


def test_a_normed_pair_of_one_share_and_one_sum_is_refused():
    from atomlite.model_ops.carriers import NormedPair, RankPartials
    from atomlite.model_ops.triton.norm.residual import rms_norm_residual
    x, w = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(ValueError, match="RankPartials together or not at all"):
        rms_norm_residual(NormedPair(RankPartials(x, None), x, w, w), x, w, 1e-6)


def test_the_one_shot_kernel_is_refused_where_it_cannot_run():
    assert refusal(torch.device("cuda"), 2, disabled=True) == "--disable-custom-all-reduce"
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
        assert peers.fits(torch.empty(shape, dtype=torch.bfloat16, device=device))
        for call in range(3):  # eager
            inputs = _inputs(shape, call, tp.size)
            x = inputs[tp.rank].to(device)
            peers.all_reduce(x)
            want = torch.stack(inputs).float().sum(0).to(torch.bfloat16)
            assert torch.equal(x.cpu(), want), (shape, call)
        if pair_offset(x.numel()) + x.numel() <= peers.plain.slot_elems(x.dtype):  # a pair: each summed as alone
            pairs = [_inputs(shape, 20 + side, tp.size) for side in range(2)]
            a, b = (p[tp.rank].to(device) for p in pairs)
            peers.all_reduce_pair(a, b)
            for got, p in zip((a, b), pairs):
                assert torch.equal(got.cpu(), torch.stack(p).float().sum(0).to(torch.bfloat16)), shape
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


def _check_residual_update_rank(tp, rows_list) -> None:
    """The residual update reading RankPartials (one branch, and a pair) equals it reading the all-reduced sum."""
    from atomlite.model_ops.carriers import NormedPair, RankPartials
    from atomlite.model_ops.peer_memory import PeerMemory
    from atomlite.model_ops.triton.norm.residual import rms_norm_residual
    torch.cuda.set_device(tp.rank)
    device, dim = torch.device("cuda", tp.rank), 5376
    peers = PeerMemory(tp.rank, tp.size, device)
    weights = [w.to(device) for w in _inputs((4, dim), 99, 1)[0].abs().add(0.5).unbind(0)]

    def update(x, residual):
        return rms_norm_residual(x, residual, weights[0], 1e-6, None, weights[1])

    def form(a, b, share: bool):
        if share:
            a, b = RankPartials(a, peers.rows), None if b is None else RankPartials(b, peers.rows)
        return a if b is None else NormedPair(a, b, weights[2], weights[3])

    for rows in rows_list:
        for pair in (False, True):
            static = [torch.zeros(rows, dim, dtype=torch.bfloat16, device=device) for _ in range(3)]
            update(form(static[0], static[1] if pair else None, True), static[2])  # loaded before the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = update(form(static[0], static[1] if pair else None, True), static[2])
            for call in range(4):  # eager, then replayed
                shares = [_inputs((rows, dim), 10 * call + side, tp.size) for side in range(2)]
                residual = _inputs((rows, dim), 50 + call, 1)[0].to(device)
                sums = [torch.stack(s).float().sum(0).to(torch.bfloat16).to(device) for s in shares]
                want = update(form(sums[0], sums[1] if pair else None, False), residual)
                mine = [s[tp.rank].to(device) for s in shares]
                got = update(form(mine[0], mine[1] if pair else None, True), residual)
                for buffer, share in zip(static, mine):
                    buffer.copy_(share)
                static[2].copy_(residual)
                graph.replay()
                for g, r, w in zip(got, captured, want):
                    assert torch.equal(g, w) and torch.equal(r, w), (rows, pair, call)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_two_gpus_sum_rank_partials_in_the_residual_update_as_the_all_reduce_would():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from atomlite.distributed.local import run_local
    run_local(_check_residual_update_rank, 2, [1, 16, 48], backend="nccl")  # 48 rows of 5376: the most one holds


@pytest.mark.gpu
def test_two_gpus_sum_exactly_eager_and_from_a_graph():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from atomlite.distributed.local import run_local
    # 2048 rows of 5376: a prefill graph's, more blocks than programs, in the two-rank slot; 512 rows: a pair whose
    # programs loop too
    run_local(_check_rank, 2, [(1, 5376), (64, 5376), (3, 1000), (512, 5376), (2048, 5376)], backend="nccl")


def test_dispatch_gives_the_one_shot_kernel_to_nvidia_and_says_why_not_to_rocm():
    from atomlite.model_ops import dispatch
    from atomlite.model_ops.platform import parse_platform
    assert dispatch.choose("one_shot_all_reduce", parse_platform("sm_90"), world=2).fn is one_shot_all_reduce
    with pytest.raises(dispatch.NoKernel, match="not verified on ROCm"):
        dispatch.choose("one_shot_all_reduce", parse_platform("gfx942"), world=2)
