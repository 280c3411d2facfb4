import pytest
import torch

from atomlite.model_ops.branches import OVERLAP_MAX_ROWS, OVERLAP_MIN_PREFILL_ROWS, overlaps, side_by_side

SLEEP_CYCLES = 50_000_000  # ~25 ms: the side branch is still running when the main one is launched


def needs_gpu(test):
    return pytest.mark.gpu(test)


def test_results_come_back_side_first_off_the_gpu():
    order = []
    result = side_by_side(lambda: order.append("side") or 1, lambda: order.append("main") or 2, torch.device("cpu"))
    assert result == (1, 2) and order == ["side", "main"]


def _slow_fill(x: torch.Tensor) -> torch.Tensor:
    torch.cuda._sleep(SLEEP_CYCLES)
    return x * 2


def _joined_sum(x: torch.Tensor) -> torch.Tensor:
    doubled, plus_one = side_by_side(lambda: _slow_fill(x), lambda: x + 1, x.device)
    return doubled + plus_one  # on the main stream: reads the side branch's output only after the join


@needs_gpu
def test_eager_join_orders_the_side_branch_before_its_reader():
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    out = _joined_sum(x)
    torch.testing.assert_close(out, 3 * x + 1)


@needs_gpu
def test_graph_replay_of_forked_branches_matches_eager():
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    _joined_sum(x)  # side stream made outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _joined_sum(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 3 * x + 1)


@needs_gpu
def test_a_fork_inside_the_main_branch_takes_its_own_lane_and_does_not_join_the_outer_side():
    """A LoRA projection forks its shrink (lane "lora") inside a MoE layer's main branch while the experts run on
    the layer's lane: its join must not wait for the experts (the outer side branch, ~25 ms of sleep here), and
    every result is right once the outer join is done."""
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    inner_joined, slow_done = torch.cuda.Event(), torch.cuda.Event()

    def slow_branch():
        out = _slow_fill(x)
        slow_done.record()  # on the layer's lane
        return out

    def main_branch():
        shrunk, base = side_by_side(lambda: x * 3, lambda: x + 2, x.device, lane="lora")
        out = shrunk + base
        inner_joined.record()
        return out

    _joined_sum(x)  # the layer's lane made before
    torch.cuda.synchronize()
    slow, inner = side_by_side(slow_branch, main_branch, x.device)
    inner_joined.synchronize()
    assert not slow_done.query(), "the inner join waited for the outer side branch"
    torch.cuda.synchronize()
    torch.testing.assert_close(inner, 4 * x + 2)
    torch.testing.assert_close(slow, 2 * x)


def test_branches_overlap_at_decode_sized_batches_and_at_prefills():
    assert overlaps(1) and overlaps(OVERLAP_MAX_ROWS) and overlaps(OVERLAP_MIN_PREFILL_ROWS) and overlaps(2048)
    assert not overlaps(OVERLAP_MAX_ROWS + 1) and not overlaps(OVERLAP_MIN_PREFILL_ROWS - 1)
