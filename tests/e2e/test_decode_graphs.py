"""Decode steps from static buffers (what a CUDA/HIP graph replays) must give the tokens of the normal path.

On CPU the static buffers feed an eager forward exactly as a replay reads them, so bucketing, padding and buffer
filling are checked without a GPU; the `gpu` tests capture real graphs and compare with eager decoding.
"""
import pytest

from atomlite import LLM
from atomlite.engine.runner.decode_graphs import bucket_for, graph_batch_sizes
from helpers import admit_optimistically, greedy, random_prompt

# batch sizes that pad: 3 -> 4, 5 -> 8, 17 -> 24
BATCH_SIZES = (3, 5, 17)


def test_graph_batch_sizes_double_to_eight_then_step_by_eight():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = graph_batch_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 3, 5, 9, 17, 64)] == [1, 4, 8, 16, 24, 64]
    assert bucket_for(65, sizes) is None


def _prompts(count: int) -> list[list[int]]:
    return [random_prompt(3 + (11 * i) % 37, seed=100 + i) for i in range(count)]


def _params(count: int):
    """Different lengths, so sequences finish mid-batch and the batch shrinks through its buckets."""
    return [greedy(20 + i % 7) for i in range(count)]


def _generate(llm: LLM, count: int) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(count), _params(count))]


def _eager_with_logprobs(llm: LLM, count: int) -> list:
    params = [greedy(20 + i % 7, logprobs=2) for i in range(count)]
    return [o.outputs[0] for o in llm.generate(_prompts(count), params)]


def _divergence(got: list[list[int]], eager: list) -> str:
    """Where replayed tokens first leave the eager ones, and how close eager's top two were there: a gap near
    float32 rounding is a tie that summation order can flip; a wide one is a wrong result."""
    for seq, (tokens, out) in enumerate(zip(got, eager)):
        for step, (a, b) in enumerate(zip(tokens, out.token_ids)):
            if a != b:
                top = sorted(out.logprobs[step].values(), reverse=True)
                return (f"sequence {seq} step {step}: replay {a}, eager {b}; eager's top-two logprob gap "
                        f"{top[0] - top[1]:.3g}")
    return "same tokens"


def _with_static_decode(llm: LLM, max_batch: int, capture: bool) -> list[int]:
    """Route decode steps through the static buffers; returns the list that records each such step's size."""
    engine = llm.engine
    graphs = engine.runner.use_decode_graphs(max_batch, engine.config.max_model_len, capture=capture)
    calls, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (calls.append(inputs.num_seqs), run(inputs, ids))[1]
    return calls


ENGINE_SETTINGS = {
    "batched": dict(),
    "preemption": dict(kv_cache_memory=72 * 1024, block_size=4, max_model_len=64),
    "max_graph_batch_4": dict(),  # batches over 4 fall back to the normal path
}


@pytest.mark.parametrize("setting", ENGINE_SETTINGS)
@pytest.mark.parametrize("count", BATCH_SIZES)
def test_static_decode_buffers_give_normal_path_tokens(checkpoints, setting, count):
    path, _ = checkpoints.get("dense")
    args = dict(dtype="float32", device="cpu", **ENGINE_SETTINGS[setting])
    expected = _generate(LLM(str(path), **args), count)
    llm = LLM(str(path), **args)
    if setting == "preemption":
        admit_optimistically(llm)
    calls = _with_static_decode(llm, 4 if setting == "max_graph_batch_4" else 24, capture=False)
    assert _generate(llm, count) == expected
    assert calls, "no decode step ran from the static buffers"
    if setting == "max_graph_batch_4":
        assert max(calls) <= 4
    if setting == "preemption" and count >= 5:  # three sequences fit without one
        assert llm.engine.scheduler.num_preemptions > 0
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())


@pytest.mark.parametrize("variant", ["dense", "ple"])
def test_static_decode_buffers_after_prefix_hits(checkpoints, variant):
    """Prefix hits, sliding windows that released blocks, KV-sharing layers: each group's table rows."""
    path, _ = checkpoints.get(variant)
    prefix = random_prompt(32, seed=5)
    prompts = [prefix + random_prompt(3 + i, seed=20 + i) for i in range(5)]
    args = dict(dtype="float32", device="cpu", block_size=8)
    expected = LLM(str(path), **args).generate(prompts, greedy(12))
    llm = LLM(str(path), **args)
    llm.generate([prefix + [7]], greedy(1))
    calls = _with_static_decode(llm, 8, capture=False)
    outs = llm.generate(prompts, greedy(12))
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expected]
    assert all(o.num_cached_tokens == 32 for o in outs) and calls


def _on_gpu(**settings) -> dict:
    """A fixed KV cache instead of a share of the GPU, so these tests can run side by side (pytest -n)."""
    return dict(dtype="float32", device="cuda", **{"kv_cache_memory": 256 * 2**20, **settings})


@pytest.mark.gpu
@pytest.mark.parametrize("setting", ["batched", "preemption"])
@pytest.mark.parametrize("count", BATCH_SIZES)
def test_graph_replay_gives_eager_tokens(checkpoints, setting, count):
    path, _ = checkpoints.get("dense")
    args = _on_gpu(**ENGINE_SETTINGS[setting])
    eager = _eager_with_logprobs(LLM(str(path), enforce_eager=True, **args), count)
    llm = LLM(str(path), max_graph_batch=24, **args)
    if setting == "preemption":
        admit_optimistically(llm)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.graphs, llm.engine.graph_note
    replays, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (replays.append(ids is not None), run(inputs, ids))[1]
    got = _generate(llm, count)
    assert got == [out.token_ids for out in eager], _divergence(got, eager)
    assert replays
    if setting == "batched":  # and most replays were launched ahead of the host (overlapped decode)
        assert sum(replays) > len(replays) / 2
    if setting == "preemption" and count >= 5:
        assert llm.engine.scheduler.num_preemptions > 0
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())


@pytest.mark.gpu
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "bfloat16"])
def test_graph_replay_gives_eager_tokens_on_a_narrow_kv_cache(checkpoints, kv_cache_dtype):
    """fp8 / bf16 caches under a float32 model, V alone on the k_eq_v global layers: replay reads what eager reads."""
    path, _ = checkpoints.get("dense")
    args = _on_gpu(kv_cache_dtype=kv_cache_dtype)
    eager = _eager_with_logprobs(LLM(str(path), enforce_eager=True, **args), 5)
    llm = LLM(str(path), max_graph_batch=8, **args)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.graphs, llm.engine.graph_note
    got = _generate(llm, 5)
    assert got == [out.token_ids for out in eager], _divergence(got, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["dense", "ple"])
def test_graph_replay_after_prefix_hits(checkpoints, variant):
    path, _ = checkpoints.get(variant)
    prefix = random_prompt(32, seed=5)
    prompts = [prefix + random_prompt(3 + i, seed=20 + i) for i in range(5)]
    args = _on_gpu(block_size=8)
    expected = LLM(str(path), enforce_eager=True, **args).generate(prompts, greedy(12))
    llm = LLM(str(path), **args)
    llm.generate([prefix + [7]], greedy(1))
    outs = llm.generate(prompts, greedy(12))
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expected]
    assert all(o.num_cached_tokens == 32 for o in outs)


@pytest.mark.gpu
def test_moe_model_graph_replay_gives_eager_tokens(checkpoints):
    """The fused MoE kernels (routing included) replay from graphs: batches of 5 pad to 8 rows."""
    path, _ = checkpoints.get("moe")
    args = _on_gpu()
    expected = _generate(LLM(str(path), enforce_eager=True, **args), 5)
    llm = LLM(str(path), max_graph_batch=8, **args)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.graphs, llm.engine.graph_note
    replays, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (replays.append(inputs.num_seqs), run(inputs, ids))[1]
    assert _generate(llm, 5) == expected
    assert replays


@pytest.mark.gpu
def test_moe_model_on_the_torch_experts_says_it_decodes_eager(checkpoints):
    path, _ = checkpoints.get("moe")
    llm = LLM(str(path), kernel_backend="torch", **_on_gpu())
    assert llm.engine.runner.graphs is None
    assert "cannot be captured" in llm.engine.graph_note


@pytest.fixture(scope="module")
def mxfp4_config(checkpoints, tmp_path_factory):
    """The tiny dense model's config.json with Quark's MXFP4 W4A4 quantization_config (run with dummy weights)."""
    import json

    from quark_configs import quark_config
    path, _ = checkpoints.get("dense")
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"] = quark_config()["quantization_config"]
    out = tmp_path_factory.mktemp("mxfp4-config")
    (out / "config.json").write_text(json.dumps(raw))
    return out


@pytest.mark.gpu
def test_mxfp4_model_replayed_from_graphs_decodes_like_the_torch_reference(mxfp4_config):
    """Decoding 1-4 sequences, the MXFP4 projections run their fp8 tiles on rows the norms quantized, and the norms
    add the projections' split-K slices. Replayed from graphs, tokens equal and logprobs match the torch reference
    (weights dequantized, inputs quantize-dequantized, float32: only summation order differs)."""
    args = _on_gpu(load_format="dummy")
    expected = _eager_with_logprobs(LLM(str(mxfp4_config), kernel_backend="torch", enforce_eager=True, **args), 3)
    llm = LLM(str(mxfp4_config), max_graph_batch=4, **args)
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.graphs, llm.engine.graph_note
    got = _eager_with_logprobs(llm, 3)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected], _divergence(
        [o.token_ids for o in got], expected)
    for ours, ref in zip(got, expected):
        for step_ours, step_ref in zip(ours.logprobs, ref.logprobs):
            for token in step_ref.keys() & step_ours.keys():
                assert step_ours[token] == pytest.approx(step_ref[token], abs=1e-3)


@pytest.fixture(scope="module", params=["dense", "moe"])
def fp8_config(checkpoints, tmp_path_factory, request):
    """A tiny model's config.json with compressed-tensors' FP8-Dynamic quantization_config (the 26B-A4B example's:
    per-channel weights, per-token activations; run with dummy weights)."""
    import json
    from pathlib import Path

    path, _ = checkpoints.get(request.param)
    raw = json.loads((path / "config.json").read_text())
    example = Path(__file__).parents[2] / "examples/configs/gemma-4-26B-A4B-it-fp8-dynamic/config.json"
    raw["quantization_config"] = json.loads(example.read_text())["quantization_config"]
    out = tmp_path_factory.mktemp(f"fp8-{request.param}")
    (out / "config.json").write_text(json.dumps(raw))
    return out


@pytest.mark.gpu
def test_fp8_graphs_with_dependent_launches_decode_as_graphs_without_them(fp8_config, monkeypatch):
    """On sm_90 the FP8 kernels (quantization, GEMMs, their split-K sums, the experts) start before the kernel ahead
    ends, and read what it wrote only after waiting for it. The same kernels captured with every launch waiting
    (ATOMLITE_PDL=0) must decode the same tokens with the same logprobs: only a race could tell them apart."""
    args = _on_gpu(load_format="dummy")
    monkeypatch.setenv("ATOMLITE_PDL", "0")
    waiting = LLM(str(fp8_config), max_graph_batch=4, **args)
    expected = _eager_with_logprobs(waiting, 3)
    del waiting
    monkeypatch.delenv("ATOMLITE_PDL")
    llm = LLM(str(fp8_config), max_graph_batch=4, **args)
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.graphs, llm.engine.graph_note
    got = _eager_with_logprobs(llm, 3)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [o.logprobs for o in got] == [o.logprobs for o in expected]
