"""The fused MoE experts on a GPU at Gemma-4-26B-A4B's shapes (read from examples/configs), bf16 and MXFP4 weights,
against the torch reference in fp32 on the same weights: eager, and replayed from a CUDA/HIP graph on new inputs.

    PYTHONPATH=. python -m pytest tests/kernels/test_moe_gpu.py -m gpu -q
"""
import pytest
import torch

from atomlite.config import load_model_spec
from atomlite.model_ops.torch_ref.moe import moe_experts as reference
from atomlite.model_ops.torch_ref.moe import mxfp4_moe_experts as mxfp4_reference
from atomlite.model_ops.triton.moe.gemm import moe_experts, mxfp4_moe_experts
from atomlite.model_ops.triton.mxfp4.gemm import needs_wide_scales, pad_to_k_align
from atomlite.quant import mxfp4

pytestmark = pytest.mark.gpu

CONFIG = "examples/configs/gemma-4-26B-A4B-it"
# bf16 inputs and weights; the fused kernels round gelu(gate) * up and the output to bf16 once each
MAX_RELATIVE_ERROR = 1e-2


@pytest.fixture(scope="module")
def shapes() -> dict:
    hf = load_model_spec(CONFIG).hf
    return dict(hidden=hf["hidden_size"], inner=hf["moe_intermediate_size"], experts=hf["num_experts"],
                top_k=hf["top_k_experts"])


def test_shapes_are_26b_a4b(shapes):
    assert shapes == dict(hidden=2816, inner=704, experts=128, top_k=8)


@pytest.fixture(scope="module")
def experts(shapes):
    gen = torch.Generator(device="cuda").manual_seed(0)
    e, h, i = shapes["experts"], shapes["hidden"], shapes["inner"]
    gate_up = (torch.randn(e, 2 * i, h, device="cuda", generator=gen) * h ** -0.5).to(torch.bfloat16)
    down = (torch.randn(e, h, i, device="cuda", generator=gen) * i ** -0.5).to(torch.bfloat16)
    return gate_up, down


def routing(tokens: int, shapes: dict, seed: int, skew: float = 0.0):
    """Router-like top-k of a softmax; skew > 0 sends most tokens to the first experts (and none to many)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(tokens, shapes["experts"], device="cuda", generator=gen)
    logits -= skew * torch.arange(shapes["experts"], device="cuda")
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), shapes["top_k"], dim=-1)
    x = torch.randn(tokens, shapes["hidden"], device="cuda", generator=gen).to(torch.bfloat16)
    return x, weights / weights.sum(-1, keepdim=True), ids


def relative_error(got: torch.Tensor, x, gate_up, down, weights, ids) -> float:
    return _relative(got, reference(x.float(), gate_up.float(), down.float(), weights, ids))


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    return ((got.float() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("tokens,skew", [(1, 0.0), (32, 0.0), (512, 0.0), (32, 0.5), (512, 0.2), (1024, 0.0),
                                         (2048, 0.0), (2048, 0.2)])  # 2048: NVIDIA_LARGE_PREFILL's 128-row tiles
def test_fused_bf16_experts_match_fp32_reference(experts, shapes, tokens, skew):
    x, weights, ids = routing(tokens, shapes, seed=tokens, skew=skew)
    if skew:
        assert ids.unique().numel() < shapes["experts"]  # some experts get no token
    got = moe_experts(x, *experts, weights, ids)
    assert relative_error(got, x, *experts, weights, ids) < MAX_RELATIVE_ERROR


def captured(fn):
    """(graph, its output) of fn, run once first to compile outside the capture."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = fn()
    return graph, out


def replay_on_new_routing(graph, x, weights, ids, shapes, seed: int) -> None:
    """The captured inputs changed in place (skewed routing from the second seed on), then a replay."""
    new_x, new_weights, new_ids = routing(x.shape[0], shapes, seed=seed, skew=0.3 * (seed % 2))
    for static, new in ((x, new_x), (weights, new_weights), (ids, new_ids)):
        static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize("tokens", [1, 32])
def test_graph_replay_on_new_routing_matches_reference(experts, shapes, tokens):
    """Captured once, replayed after the inputs change: routing and tiles are computed on the GPU."""
    x, weights, ids = routing(tokens, shapes, seed=100)
    graph, out = captured(lambda: moe_experts(x, *experts, weights, ids))
    for seed in (101, 102):
        replay_on_new_routing(graph, x, weights, ids, shapes, seed)
        assert relative_error(out, x, *experts, weights, ids) < MAX_RELATIVE_ERROR


@pytest.fixture(scope="module")
def mxfp4_experts(experts):
    """Per projection: (packed bytes, scales) as Quark stores them, and the fused kernels' padded layout."""
    projections = []
    for weight in experts:
        packed = [mxfp4.quantize(w.float()) for w in weight]
        padded = [pad_to_k_align(p, s) for p, s in packed]
        projections.append((torch.stack([p for p, _ in packed]), torch.stack([s for _, s in packed]),
                            torch.stack([p for p, _ in padded]), torch.stack([s for _, s in padded])))
    return projections


def wide_scales(mxfp4_experts) -> bool:
    """The load-time check (it syncs: made before any capture, as MXFP4Experts makes it at load)."""
    return any(needs_wide_scales(projection[3]) for projection in mxfp4_experts)


def run_mxfp4(mxfp4_experts, x, weights, ids, wide: bool) -> torch.Tensor:
    (_, _, gate_up, gate_up_scale), (_, _, down, down_scale) = mxfp4_experts
    return mxfp4_moe_experts(x, gate_up, gate_up_scale, down, down_scale, weights, ids, True, wide)


def mxfp4_error(got, mxfp4_experts, x, weights, ids) -> float:
    (gate_up, gate_up_scale, _, _), (down, down_scale, _, _) = mxfp4_experts
    return _relative(got, mxfp4_reference(x.float(), gate_up, gate_up_scale, down, down_scale, weights, ids, True))


@pytest.mark.parametrize("tokens,skew", [(1, 0.0), (32, 0.0), (512, 0.2), (2048, 0.0)])
def test_fused_mxfp4_experts_match_fp32_reference(mxfp4_experts, shapes, tokens, skew):
    x, weights, ids = routing(tokens, shapes, seed=tokens, skew=skew)
    got = run_mxfp4(mxfp4_experts, x, weights, ids, wide_scales(mxfp4_experts))
    assert mxfp4_error(got, mxfp4_experts, x, weights, ids) < MAX_RELATIVE_ERROR


@pytest.mark.parametrize("tokens", [1, 8])  # the few-pairs kernels, then the grouped ones
def test_mxfp4_graph_replay_on_new_routing_matches_reference(mxfp4_experts, shapes, tokens):
    wide = wide_scales(mxfp4_experts)
    x, weights, ids = routing(tokens, shapes, seed=200)
    graph, out = captured(lambda: run_mxfp4(mxfp4_experts, x, weights, ids, wide))
    for seed in (201, 202):
        replay_on_new_routing(graph, x, weights, ids, shapes, seed)
        assert mxfp4_error(out, mxfp4_experts, x, weights, ids) < MAX_RELATIVE_ERROR
