"""Speculative decoding end to end on tiny random models (CPU): greedy output with any drafter is token for token
the output without one (mixed lengths, sliding windows, stop strings, preemption, prefix hits); sampled output
keeps the target's distribution; KV blocks all come back."""
import pytest
import torch
from scipy.stats import chi2_contingency

from atomlite import LLM, SamplingParams
from atomlite.engine.spec.drafters import ReplayDrafter
from atomlite.errors import ConfigError
import tiny_models
from helpers import admit_optimistically, random_prompt

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = [random_prompt(n, seed=n) for n in (1, 5, 9, 23, 40)]  # the tiny models' sliding window is 8


def outputs(llm: LLM, prompts, params) -> list[tuple]:
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason)
            for o in llm.generate(prompts, params)]


def with_drafter(llm: LLM, kind: str, scripts: dict) -> LLM:
    vocab = llm.engine.vocab_size
    llm.engine.set_drafter(ReplayDrafter(scripts, vocab, corrupt=kind == "rejected"), 4)
    return llm


def scripts_of(prompts, results) -> dict:
    return {tuple(p): tokens for p, (tokens, _, _) in zip(prompts, results)}


@pytest.fixture(scope="module")
def random_assistant(tmp_path_factory) -> str:
    """A random-weight Gemma 4 assistant for the tiny dense target (its drafts are mostly wrong)."""
    out = tmp_path_factory.mktemp("assistant") / "dense"
    tiny_models.build_assistant("dense", out)
    return str(out)


def spec_args(drafter: str, assistant: str | None = None) -> dict:
    if drafter == "ngram":
        return {"speculative_config": NGRAM}
    if drafter == "mtp":
        return {"speculative_config": {"method": "mtp", "model": assistant, "num_speculative_tokens": 3}}
    return {}


@pytest.mark.parametrize("drafter", ["ngram", "mtp", "oracle", "rejected"])
def test_greedy_output_is_the_output_without_drafts(checkpoints, random_assistant, drafter):
    path, _ = checkpoints.get("dense")
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2) for n in (30, 7, 19, 30, 12)]
    base = LLM(str(path), dtype="float32", device="cpu")
    want = base.generate(PROMPTS, params)
    llm = LLM(str(path), dtype="float32", device="cpu", **spec_args(drafter, random_assistant))
    if drafter in ("oracle", "rejected"):
        with_drafter(llm, drafter, {tuple(p): o.outputs[0].token_ids for p, o in zip(PROMPTS, want)})
    got = llm.generate(PROMPTS, params)
    for w, g in zip(want, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lw, lg in zip(w.outputs[0].logprobs, g.outputs[0].logprobs):
            assert lw.keys() == lg.keys()
            assert all(abs(lw[t] - lg[t]) < 1e-4 for t in lw)
    stats = llm.engine.spec_stats
    assert stats.num_drafts > 0
    if drafter == "oracle":  # every draft is the target's own next token
        assert stats.num_accepted_tokens == stats.num_draft_tokens
        assert stats.mean_acceptance_length > 3
    if drafter == "rejected":
        assert stats.num_accepted_tokens == 0
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())


@pytest.mark.parametrize("drafter", ["ngram", "mtp"])
def test_greedy_identity_under_preemption_and_prefix_hits(checkpoints, random_assistant, drafter):
    path, _ = checkpoints.get("dense")
    shared = random_prompt(12, seed=99)
    prompts = [shared + random_prompt(n % 7 + 1, seed=n) for n in range(16)] + PROMPTS
    args = dict(dtype="float32", device="cpu", block_size=4, max_model_len=96, max_num_seqs=32)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    roomy = LLM(str(path), **args)
    want = outputs(roomy, prompts, params)
    budget = sum(g.block_bytes * (4 * g.spec.blocks_held(60, 4) + 1) for g in roomy.engine.kv_plan.groups)
    llm = admit_optimistically(LLM(str(path), kv_cache_memory=budget, **spec_args(drafter, random_assistant), **args))
    assert outputs(llm, prompts, params) == want
    engine = llm.engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.prefix_cache_hits > 0
    assert engine.spec_stats.num_drafts > 0
    assert all(used == 0 for _, used, _ in engine.kv.usage())


@pytest.mark.parametrize("drafter", ["ngram", "oracle"])
def test_stop_strings_and_eos_end_where_they_do_without_drafts(random_model_dir, drafter):
    prompts = ["The cat sat on the mat. The cat", "abcabcabc", "Hello there"]
    base = LLM(str(random_model_dir), dtype="float32", device="cpu")
    probe = outputs(base, prompts, SamplingParams(temperature=0, max_tokens=24))
    # stop on a piece of each greedy output, so that drafts run past the stop string
    stops = [text[5:8] for _, text, _ in probe if len(text) > 8] or ["e"]
    params = SamplingParams(temperature=0, max_tokens=24, stop=stops)
    want = outputs(base, prompts, params)
    spec_args = {"speculative_config": NGRAM} if drafter == "ngram" else {}
    llm = LLM(str(random_model_dir), dtype="float32", device="cpu", **spec_args)
    if drafter == "oracle":
        with_drafter(llm, drafter, scripts_of([base.engine.encode(p) for p in prompts], probe))
    assert outputs(llm, prompts, params) == want
    assert sum(reason == "stop" for _, _, reason in want) >= 2
    if drafter == "oracle":  # drafts ran past the stop strings and were accepted
        assert llm.engine.spec_stats.num_accepted_tokens == llm.engine.spec_stats.num_draft_tokens > 0


def test_sampled_tokens_keep_the_target_distribution(checkpoints):
    """The first two output tokens of 600 seeded requests: with drafts always proposed (and mostly rejected) and
    without, the same distribution (two-sample chi-square on the tokens drawn often enough)."""
    path, _ = checkpoints.get("dense")
    prompt = random_prompt(6, seed=5)
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=s) for s in range(600)]
    args = dict(dtype="float32", device="cpu", max_num_seqs=256)
    base = LLM(str(path), **args)
    want = [o.outputs[0].token_ids for o in base.generate([prompt] * 600, params)]
    llm = LLM(str(path), **args)
    greedy = base.generate(prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    llm.engine.set_drafter(ReplayDrafter({tuple(prompt): greedy.outputs[0].token_ids}, llm.engine.vocab_size), 2)
    got = [o.outputs[0].token_ids for o in llm.generate([prompt] * 600, params)]
    assert llm.engine.spec_stats.num_drafts > 0
    for position in (1, 2):
        a = torch.bincount(torch.tensor([t[position] for t in want]), minlength=96)
        b = torch.bincount(torch.tensor([t[position] for t in got]), minlength=96)
        common = (a + b) >= 10
        table = torch.stack([a[common], b[common]]).numpy()
        assert chi2_contingency(table).pvalue > 1e-3, (position, table)


@pytest.mark.parametrize("config,message", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "draft_model", "model": "x", "num_speculative_tokens": 2}, "not supported"),
    ({"method": "mtp", "num_speculative_tokens": 2}, "needs model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "takes no model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown field"),
    ("{not json", "not valid JSON"),
])
def test_bad_speculative_config_is_a_clear_error(checkpoints, config, message):
    path, _ = checkpoints.get("dense")
    with pytest.raises(ConfigError, match=message):
        LLM(str(path), dtype="float32", device="cpu", speculative_config=config)


@pytest.mark.parametrize("drafter", ["mtp", "oracle"])
def test_verify_steps_from_static_buffers_give_the_same_tokens(checkpoints, random_assistant, drafter):
    """The verify graphs' static buffers (run eagerly here; captured on a GPU) with mixed sequence lengths, batch
    buckets with padding sequences, and the drafter reading hidden states from them."""
    path, _ = checkpoints.get("dense")
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    base = LLM(str(path), dtype="float32", device="cpu")
    want = outputs(base, PROMPTS, params)
    llm = LLM(str(path), dtype="float32", device="cpu", **spec_args(drafter, random_assistant))
    k = 3
    if drafter == "oracle":
        with_drafter(llm, drafter, scripts_of(PROMPTS, want))
        k = 4
    engine = llm.engine
    engine.runner.use_decode_graphs(8, engine.config.max_model_len, capture=False)
    graphs = engine.runner.use_verify_graphs(k, 8, engine.config.max_model_len, capture=False)
    calls, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (calls.append(inputs.num_seqs), run(inputs, ids))[1]
    assert outputs(llm, PROMPTS, params) == want
    assert calls and max(calls) > 1, calls
    assert engine.spec_stats.num_drafts > 0


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", ["mtp", "oracle", "ngram"])
def test_verify_graphs_on_the_gpu_give_the_same_tokens(checkpoints, random_assistant, drafter):
    """Captured decode and verify graphs (float32, a fixed cache): greedy output equals decoding without drafts."""
    path, _ = checkpoints.get("dense")
    args = dict(dtype="float32", device="cuda", kv_cache_memory=256 * 2**20)
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    want = outputs(LLM(str(path), **args), PROMPTS, params)
    if drafter == "oracle":  # verify graphs are captured for the configured k: n-gram's, then the oracle swapped in
        llm = LLM(str(path), **args, speculative_config={**NGRAM, "num_speculative_tokens": 4})
        with_drafter(llm, drafter, scripts_of(PROMPTS, want))
    else:
        llm = LLM(str(path), **args, **spec_args(drafter, random_assistant))
    assert "verify steps" in llm.engine.graph_note
    assert ("draft steps" in llm.engine.graph_note) == (drafter == "mtp")
    graphs = llm.engine.runner.verify_graphs
    calls, run = [], graphs.run
    graphs.run = lambda inputs, ids=None: (calls.append(inputs.num_seqs), run(inputs, ids))[1]
    assert outputs(llm, PROMPTS, params) == want
    assert calls


def test_draft_rounds_from_static_buffers_give_the_eager_drafts(checkpoints, random_assistant):
    """The assistant's rounds through the draft graphs' static buffers (eager here, captured on a GPU), batch
    buckets padded: the same drafts as the eager rounds, so the same output and acceptance."""
    path, _ = checkpoints.get("dense")
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    eager = LLM(str(path), dtype="float32", device="cpu", **spec_args("mtp", random_assistant))
    want = outputs(eager, PROMPTS, params)
    llm = LLM(str(path), dtype="float32", device="cpu", **spec_args("mtp", random_assistant))
    graphs = llm.engine.drafter.use_graphs(8, llm.engine.config.max_model_len, 3, capture=False)
    calls, propose = [], graphs.propose
    graphs.propose = lambda seqs, hidden: (calls.append(len(seqs)), propose(seqs, hidden))[1]
    assert outputs(llm, PROMPTS, params) == want
    assert calls and max(calls) > 1
    assert llm.engine.spec_stats.accepted_per_pos == eager.engine.spec_stats.accepted_per_pos


def test_verify_graphs_need_an_attention_kernel_that_finds_the_batch_on_the_device(checkpoints):
    """Triton's attention replays verify steps from graphs; one that needs the host's lengths for several queries
    per sequence (AITER's, which gathers keys per step; the reference here) leaves verify steps eager, and says so."""
    from atomlite.engine.runner.decode_graphs import verify_graphs_off_reason
    path, _ = checkpoints.get("dense")
    # Triton runs CPU tensors only under the interpreter (set where no GPU is): elsewhere, on the GPU
    on_gpu = dict(device="cuda", enforce_eager=True, kv_cache_memory=64 * 2**20) if torch.cuda.is_available() else {}
    triton = LLM(str(path), dtype="float32", **{"device": "cpu", **on_gpu}, kernel_backend="triton")
    assert verify_graphs_off_reason(triton.engine.model) is None
    reference = LLM(str(path), dtype="float32", device="cpu", kernel_backend="torch")
    assert verify_graphs_off_reason(reference.engine.model) == "torch attention needs the host's lengths for them"
