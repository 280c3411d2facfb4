"""Prefill and mixed steps from static buffers (what a prefill graph replays) must give the normal path's tokens and
logprobs.

On CPU the static buffers feed an eager forward exactly as a replay reads them: token buckets, the padding sequence,
empty sequence slots, chunked prompts beside decoding sequences, prefix hits and prompt logprobs are checked without
a GPU (the torch backend, and the Triton kernels under the interpreter); the `gpu` tests capture real graphs.
"""
import pytest
import torch

from atomlite import LLM
from atomlite.config import parse_compilation_config
from atomlite.engine.runner.decode_graphs import bucket_for
from atomlite.engine.runner.prefill_graphs import prefill_token_buckets
from atomlite.errors import ConfigError
from helpers import greedy, random_prompt


def test_token_buckets_double_to_512_then_step_by_256():
    assert prefill_token_buckets(16) == [16]
    assert prefill_token_buckets(100) == [16, 32, 64, 100]
    assert prefill_token_buckets(2048) == [16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    sizes = prefill_token_buckets(2048)
    assert [bucket_for(n, sizes) for n in (1, 17, 513, 2040, 2048)] == [16, 32, 768, 2048, 2048]


def test_compilation_config_takes_vllms_cudagraph_modes_and_refuses_the_rest():
    assert parse_compilation_config(None) == {}
    assert parse_compilation_config('{"cudagraph_mode": "full_decode_only"}') == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert parse_compilation_config({"cudagraph_mode": "NONE"}) == {"cudagraph_mode": "NONE"}
    with pytest.raises(ConfigError, match="level"):
        parse_compilation_config('{"level": 3}')
    with pytest.raises(ConfigError, match="SOMETIMES"):
        parse_compilation_config('{"cudagraph_mode": "SOMETIMES"}')
    with pytest.raises(ConfigError, match="not JSON"):
        parse_compilation_config("{cudagraph_mode")


def _with_static_prefill(llm: LLM, capture: bool) -> list[tuple[int, int]]:
    """Route prefill and mixed steps through the static buffers; returns the (tokens, sequences) of each such step."""
    engine = llm.engine
    config = engine.config
    graphs = engine.runner.use_prefill_graphs(config.max_num_batched_tokens, config.max_num_seqs,
                                              config.max_model_len, capture=capture)
    calls, run = [], graphs.run
    graphs.run = lambda inputs: (calls.append((inputs.query_starts[-1], inputs.num_seqs)), run(inputs))[1]
    return calls


def _outputs(llm: LLM, prompts, params):
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs) for o in llm.generate(prompts, params)]


def _assert_close(got, want):
    for (tokens, logprobs, prompt_logprobs), (want_tokens, want_logprobs, want_prompt) in zip(got, want, strict=True):
        assert tokens == want_tokens
        for step, want_step in zip(logprobs, want_logprobs, strict=True):
            assert step.keys() == want_step.keys()
            assert all(abs(step[t] - want_step[t]) < 1e-4 for t in step)
        assert (prompt_logprobs is None) == (want_prompt is None)
        for step, want_step in zip(prompt_logprobs or [], want_prompt or [], strict=True):
            if want_step is not None:
                assert all(abs(step[t] - want_step[t]) < 1e-4 for t in want_step)


def _prompts_and_params():
    """Lengths that pad to several buckets, a prompt chunked over steps of 64 tokens beside decoding sequences, and
    prompt logprobs on one."""
    prompts = [random_prompt(n, seed=n) for n in (5, 23, 40, 150)]
    params = [greedy(8, logprobs=2), greedy(6, logprobs=2), greedy(7, logprobs=2, prompt_logprobs=1),
              greedy(5, logprobs=2)]
    return prompts, params


@pytest.mark.parametrize("variant", ["dense", "moe", "ple"])
def test_static_prefill_buffers_give_normal_path_tokens_and_logprobs(checkpoints, variant):
    path, _ = checkpoints.get(variant)
    args = dict(dtype="float32", device="cpu", max_num_batched_tokens=64, max_num_seqs=8, block_size=8)
    prompts, params = _prompts_and_params()
    want = _outputs(LLM(str(path), **args), prompts, params)
    llm = LLM(str(path), **args)
    calls = _with_static_prefill(llm, capture=False)
    _assert_close(_outputs(llm, prompts, params), want)
    assert any(tokens > seqs > 1 for tokens, seqs in calls), calls  # a mixed step ran from the buffers
    assert any(tokens == 64 for tokens, _ in calls), calls  # and a full chunk of the long prompt
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())


def test_static_prefill_buffers_pad_past_max_model_len(checkpoints):
    """A bucket of more padding rows than one sequence may hold tokens (36 prompt tokens pad to 64): the padding
    rows stay within the position tables."""
    path, _ = checkpoints.get("dense")
    args = dict(dtype="float32", device="cpu", max_num_batched_tokens=64, max_model_len=24)
    prompts = [random_prompt(n, seed=n) for n in (10, 12, 14)]
    want = _outputs(LLM(str(path), **args), prompts, [greedy(6, logprobs=1)] * 3)
    llm = LLM(str(path), **args)
    calls = _with_static_prefill(llm, capture=False)
    _assert_close(_outputs(llm, prompts, [greedy(6, logprobs=1)] * 3), want)
    assert (36, 3) in calls


def test_static_prefill_buffers_after_prefix_hits(checkpoints):
    """A prompt whose first blocks are cached starts past position 0: its queries sit at the end of its keys."""
    path, _ = checkpoints.get("ple")
    prefix = random_prompt(32, seed=5)
    prompts = [prefix + random_prompt(3 + i, seed=20 + i) for i in range(3)]
    args = dict(dtype="float32", device="cpu", block_size=8, max_num_batched_tokens=64)
    want = _outputs(LLM(str(path), **args), prompts, [greedy(6, logprobs=1)] * 3)
    llm = LLM(str(path), **args)
    llm.generate([prefix + [7]], greedy(1))
    calls = _with_static_prefill(llm, capture=False)
    _assert_close(_outputs(llm, prompts, [greedy(6, logprobs=1)] * 3), want)
    assert calls


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_static_prefill_buffers_on_the_triton_kernels(checkpoints, variant):
    """The Triton attention over the padding sequence and the empty sequence slots (the interpreter on CPU)."""
    path, _ = checkpoints.get(variant)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = dict(dtype="float32", device=device, kernel_backend="triton", max_num_batched_tokens=32, max_num_seqs=4,
                enforce_eager=True, kv_cache_memory=256 * 2**20 if device == "cuda" else None)
    prompts = [random_prompt(n, seed=n) for n in (3, 21, 40)]
    want = _outputs(LLM(str(path), **args), prompts, [greedy(4, logprobs=1)] * 3)
    llm = LLM(str(path), **args)
    calls = _with_static_prefill(llm, capture=False)
    _assert_close(_outputs(llm, prompts, [greedy(4, logprobs=1)] * 3), want)
    assert calls


def _on_gpu(**settings) -> dict:
    return dict(dtype="float32", device="cuda", **{"kv_cache_memory": 256 * 2**20, **settings})


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["dense", "moe", "ple"])
def test_prefill_graph_replay_gives_the_eager_tokens(checkpoints, variant):
    path, _ = checkpoints.get(variant)
    prompts, params = _prompts_and_params()
    args = _on_gpu(max_num_batched_tokens=64, max_num_seqs=8)
    want = _outputs(LLM(str(path), compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"}, **args), prompts,
                    params)
    llm = LLM(str(path), **args)
    graphs = llm.engine.runner.prefill_graphs
    assert graphs is not None and graphs.graphs, llm.engine.graph_note
    replays, run = [], graphs.run
    graphs.run = lambda inputs: (replays.append(inputs.num_seqs), run(inputs))[1]
    _assert_close(_outputs(llm, prompts, params), want)
    assert replays and llm.engine.runner.forward_passes["graph"] > 0
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())
