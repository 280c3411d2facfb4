"""atomlite's Gemma 3 text model against transformers' Gemma3ForCausalLM, float32, on tiny random models with every
weight randomized (norms too): prompt logprobs and greedy tokens on configs of several shapes (linear RoPE scaling
and soft-capping, head_dim != hidden / heads with one KV head and its own layer_types, a hub-form config.json), and
a Gemma3ForConditionalGeneration checkpoint's text model; and the engine paths a model must not change: chunked
prefill, prefix-cache hits, decode from static buffers, and on a GPU decode replayed from captured graphs."""
import pytest
import torch

from atomlite import LLM
from helpers import atomlite_prompt_logprobs, greedy, hf_greedy, hf_logprobs, random_prompt

VOCAB = 96
CASES = [("gemma3", False), ("gemma3_linear_softcap", False), ("gemma3_wide_heads", False), ("gemma3", True)]


def assert_logprobs_match(mine: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.allclose(mine, expected, atol=1e-4, rtol=0), (mine - expected).abs().max()


@pytest.mark.parametrize("variant,hub_form", CASES)
def test_prompt_logprobs_match_transformers(checkpoints, variant, hub_form):
    path, ref = checkpoints.gemma3(variant, hub_form=hub_form)
    llm = LLM(str(path), dtype="float32", device="cpu")
    ids = random_prompt(40, seed=1)  # longer than every sliding window
    assert_logprobs_match(atomlite_prompt_logprobs(llm, ids, VOCAB), hf_logprobs(ref, ids)[:-1])


@pytest.mark.parametrize("variant,hub_form", CASES)
def test_greedy_tokens_match_transformers_generate(checkpoints, variant, hub_form):
    path, ref = checkpoints.gemma3(variant, hub_form=hub_form)
    llm = LLM(str(path), dtype="float32", device="cpu")
    prompts = [random_prompt(n, seed=n) for n in (1, 5, 8, 9, 23)]
    for prompt, out in zip(prompts, llm.generate(prompts, greedy(12))):
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 12), len(prompt)


def test_conditional_generation_checkpoint_runs_its_text_model_like_transformers(checkpoints):
    """A Gemma3ForConditionalGeneration checkpoint (language_model.* weights, a text_config that leaves transformers'
    defaults out, a vision tower left unread) against transformers' own class on text. final_logit_softcapping is
    off: transformers' Gemma3ForConditionalGeneration never applies it (its Gemma3ForCausalLM does, as atomlite
    does for both)."""
    path, ref = checkpoints.gemma3("gemma3_linear_softcap", multimodal=True, final_logit_softcapping=None)
    llm = LLM(str(path), dtype="float32", device="cpu")
    ids = random_prompt(40, seed=2)
    assert_logprobs_match(atomlite_prompt_logprobs(llm, ids, VOCAB), hf_logprobs(ref, ids)[:-1])


def test_chunked_prefill_matches_transformers(checkpoints):
    """A 7-token budget cuts a 40-token prompt into chunks that each start mid sliding window."""
    path, ref = checkpoints.gemma3("gemma3_linear_softcap")
    llm = LLM(str(path), dtype="float32", device="cpu", max_num_batched_tokens=7)
    ids = random_prompt(40, seed=3)
    assert_logprobs_match(atomlite_prompt_logprobs(llm, ids, VOCAB), hf_logprobs(ref, ids)[:-1])
    assert llm.generate([ids], greedy(10))[0].outputs[0].token_ids == hf_greedy(ref, ids, 10)


def test_prefix_cache_hit_gives_transformers_tokens(checkpoints):
    path, ref = checkpoints.gemma3("gemma3")
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=4)
    prefix = random_prompt(24, seed=7)
    llm.generate([prefix + random_prompt(3, seed=8)], greedy(4))
    prompt = prefix + random_prompt(5, seed=9)
    out = llm.generate([prompt], greedy(12))[0]
    assert out.num_cached_tokens >= 16
    assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 12)


def test_decode_from_static_buffers_gives_transformers_tokens(checkpoints):
    """The decode graphs' path (static buffers, eager on CPU: capture=False) over a batch that shrinks as sequences
    finish."""
    path, ref = checkpoints.gemma3("gemma3_wide_heads")
    llm = LLM(str(path), dtype="float32", device="cpu")
    engine = llm.engine
    graphs = engine.runner.use_decode_graphs(4, engine.config.max_model_len, capture=False)
    calls, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (calls.append(inputs.num_seqs), run(inputs, ids))[1]
    prompts = [random_prompt(n, seed=20 + n) for n in (3, 11, 17)]
    outputs = llm.generate(prompts, [greedy(8 + 3 * i) for i in range(3)])
    assert calls, "no decode step ran from the static buffers"
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 8 + 3 * i)


@pytest.mark.gpu
def test_graph_replay_on_the_gpu_gives_the_eager_tokens_and_logprobs(checkpoints):
    """Decode graphs captured on the GPU (sliding and global layers, linear RoPE scaling, soft-capping) over a batch
    that shrinks as sequences finish and after a prefix-cache hit: the tokens and logprobs eager decode gives."""
    path, _ = checkpoints.gemma3("gemma3_linear_softcap")
    args = dict(dtype="float32", device="cuda", kv_cache_memory=256 * 2**20, block_size=8)
    prefix = random_prompt(24, seed=7)
    prompts = [prefix + random_prompt(n, seed=30 + n) for n in (3, 11, 17)]
    params = [greedy(8 + 3 * i) for i in range(3)]
    eager = LLM(str(path), enforce_eager=True, **args)
    eager.generate([prefix + [5]], greedy(1))
    expected = eager.generate(prompts, params)
    llm = LLM(str(path), **args)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.graphs, llm.engine.graph_note
    replays, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (replays.append(inputs.num_seqs), run(inputs, ids))[1]
    llm.generate([prefix + [5]], greedy(1))
    outputs = llm.generate(prompts, params)
    assert replays and all(out.num_cached_tokens >= 16 for out in outputs)
    for got, want in zip(outputs, expected):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
