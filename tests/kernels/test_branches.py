import pytest
import torch

from atomlite.model_ops.branches import side_by_side

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
