"""capture_buckets, which captures decode steps and the vision and audio towers: one graph per bucket, largest first,
each bucket's forward run twice before its capture, inside steps(), and each replay recomputes its bucket from the
static input it reads."""
import contextlib

import pytest
import torch

from atomlite.model_ops.graph_capture import capture_buckets

pytestmark = pytest.mark.gpu


def test_one_graph_per_bucket_largest_first_replaying_its_bucket():
    device = torch.device("cuda")
    static_in, out = torch.zeros(8, device=device), torch.zeros(8, device=device)
    calls, inside = [], []

    @contextlib.contextmanager
    def steps():
        inside.append(True)
        yield
        inside.append(False)

    def forward(bucket: int) -> None:
        calls.append(bucket)
        out[:bucket].copy_(static_in[:bucket] * 2 + bucket)

    captured = capture_buckets(device, [1, 4, 8], forward, lambda bucket: static_in.fill_(bucket), steps=steps)
    assert list(captured.graphs) == [8, 4, 1] and calls == [8] * 3 + [4] * 3 + [1] * 3
    assert inside == [True, False] * 3 and captured.seconds > 0
    assert captured.report("vision tower graphs", unit=" soft tokens").describe().startswith(
        "vision tower graphs: 3 sizes (1, 4, 8 soft tokens) captured in ")
    for bucket, graph in captured.graphs.items():
        static_in.copy_(torch.arange(8.0, device=device))
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[:bucket], torch.arange(float(bucket), device=device) * 2 + bucket)
        assert out[bucket:].eq(0).all()
