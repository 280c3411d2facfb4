"""Scheduling must never change the tokens: alone or batched, chunked, preempted, or from the prefix cache."""
import math

import pytest

from atomlite import LLM, SamplingParams
from helpers import DEVICES, admit_optimistically, greedy, hf_greedy, random_prompt

PROMPT_LENGTHS = (3, 8, 17, 30, 41)


@pytest.fixture(scope="module")
def dense(checkpoints):
    return checkpoints.get("dense")


@pytest.fixture(scope="module")
def expected(dense):
    _, ref = dense
    return {n: hf_greedy(ref, random_prompt(n, seed=n), 10) for n in PROMPT_LENGTHS}


def run(path, prompts, device="cpu", optimistic=False, **engine_args):
    llm = LLM(str(path), dtype="float32", device=device, **engine_args)
    if optimistic:
        admit_optimistically(llm)
    return llm, [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(10))]


ENGINE_SETTINGS = {
    "batched": {},
    "chunked_prefill": dict(max_num_batched_tokens=7),
    "one_token_steps": dict(max_num_batched_tokens=1),
    "preemption": dict(kv_cache_memory=72 * 1024, block_size=4, max_model_len=64),
    "block_size_32": dict(block_size=32),
    "no_prefix_cache": dict(enable_prefix_caching=False, max_num_seqs=2),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setting", ENGINE_SETTINGS)
def test_batched_scheduling_gives_transformers_tokens(dense, expected, setting, device):
    path, _ = dense
    prompts = [random_prompt(n, seed=n) for n in PROMPT_LENGTHS]
    llm, tokens = run(path, prompts, device, optimistic=setting == "preemption", **ENGINE_SETTINGS[setting])
    assert tokens == [expected[n] for n in PROMPT_LENGTHS]
    if setting == "preemption":
        assert llm.engine.scheduler.num_preemptions > 0
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())


def test_each_prompt_alone_gives_transformers_tokens(dense, expected):
    path, _ = dense
    llm = LLM(str(path), dtype="float32", device="cpu")
    for n in PROMPT_LENGTHS:
        assert llm.generate([random_prompt(n, seed=n)], greedy(10))[0].outputs[0].token_ids == expected[n]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["dense", "ple"])
def test_prefix_cache_hit_gives_same_tokens_and_sees_every_earlier_key(checkpoints, variant, device):
    """A shared 32-token prefix is served from the cache; the suffix chunk's global (512-style) layers must
    still attend to all 32 cached keys (a top-left aligned mask would hide them and change the tokens)."""
    path, ref = checkpoints.get(variant)
    llm = LLM(str(path), dtype="float32", device=device, block_size=8)
    prefix = random_prompt(32, seed=5)
    first = prefix + random_prompt(6, seed=6)
    second = prefix + random_prompt(4, seed=7)
    out1 = llm.generate([first], greedy(8))[0]
    out2 = llm.generate([second], greedy(8))[0]
    assert out1.num_cached_tokens == 0
    assert out2.num_cached_tokens == 32
    assert out1.outputs[0].token_ids == hf_greedy(ref, first, 8)
    assert out2.outputs[0].token_ids == hf_greedy(ref, second, 8)


def test_prefix_hit_under_sliding_window_only_reuses_blocks_still_held(checkpoints):
    """After a long generation the sliding group has released early blocks: a prompt sharing only that early
    prefix must not claim a hit the sliding group cannot serve exactly."""
    path, ref = checkpoints.get("dense")
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=4)
    prefix = random_prompt(24, seed=11)
    llm.generate([prefix], greedy(30))
    prompt = prefix[:16] + random_prompt(5, seed=12)
    out = llm.generate([prompt], greedy(6))[0]
    assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 6)


def test_sliding_group_holds_a_bounded_number_of_blocks(dense):
    path, _ = dense
    block_size = 4
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=block_size, max_model_len=256)
    engine = llm.engine
    window = engine.model.model.window
    bound = math.ceil(window / block_size) + 2
    seq = engine.add_request("long", random_prompt(20, seed=3), greedy(150))
    sliding = [g.id for g in engine.kv.groups if g.spec.kind == "sliding"]
    assert sliding
    peak = 0
    while engine.has_unfinished():
        engine.step()
        if seq.block_tables:
            peak = max(peak, max(sum(b != 0 for b in seq.block_tables[g]) for g in sliding))
    assert len(seq.output_token_ids) == 150
    assert 0 < peak <= bound
    assert all(used == 0 for _, used, _ in engine.kv.usage())


def test_abort_returns_every_block(dense):
    path, _ = dense
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=4)
    engine = llm.engine
    for i in range(4):
        engine.add_request(f"r{i}", random_prompt(10 + i, seed=i), greedy(50))
    for _ in range(5):
        engine.step()
    assert any(used for _, used, _ in engine.kv.usage())
    for i in range(4):
        engine.abort(f"r{i}")
    assert not engine.has_unfinished()
    assert all(used == 0 for _, used, _ in engine.kv.usage())


def test_seeded_sampling_is_reproducible_and_batch_independent(dense):
    path, _ = dense
    llm = LLM(str(path), dtype="float32", device="cpu")
    prompt = random_prompt(12, seed=2)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=123, max_tokens=12, ignore_eos=True)
    alone = llm.generate([prompt], params)[0].outputs[0].token_ids
    batched = llm.generate([random_prompt(7, seed=9), prompt], [greedy(5), params])[1].outputs[0].token_ids
    assert alone == batched
    other_seed = SamplingParams(temperature=1.0, seed=124, max_tokens=12, ignore_eos=True)
    assert llm.generate([prompt], other_seed)[0].outputs[0].token_ids != alone


def test_top_k_one_is_greedy(dense, expected):
    path, _ = dense
    llm = LLM(str(path), dtype="float32", device="cpu")
    params = SamplingParams(temperature=0.8, top_k=1, max_tokens=10, ignore_eos=True, seed=0)
    assert llm.generate([random_prompt(17, seed=17)], params)[0].outputs[0].token_ids == expected[17]


def test_logprobs_and_stop_token_ids(dense, expected):
    path, ref = dense
    llm = LLM(str(path), dtype="float32", device="cpu")
    want = expected[30]
    stop_at = want[4]
    out = llm.generate([random_prompt(30, seed=30)], greedy(10, logprobs=3, stop_token_ids=[stop_at]))[0]
    completion = out.outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.token_ids == want[:want.index(stop_at) + 1]
    for token, entry in zip(completion.token_ids, completion.logprobs):
        assert token in entry and len(entry) <= 4
        assert max(entry.values()) == entry[token]  # greedy picks the most likely token


def test_max_tokens_and_context_length_end_with_length(dense):
    path, _ = dense
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=20)
    out = llm.generate([random_prompt(15, seed=1), random_prompt(3, seed=1)], greedy(30))
    assert [len(o.outputs[0].token_ids) for o in out] == [5, 17]
    assert all(o.outputs[0].finish_reason == "length" for o in out)


def test_vanishing_temperature_is_greedy_not_nan(dense, expected):
    path, _ = dense
    llm = LLM(str(path), dtype="float32", device="cpu")
    params = SamplingParams(temperature=1e-30, max_tokens=10, ignore_eos=True, top_p=0.5)
    assert llm.generate([random_prompt(17, seed=17)], params)[0].outputs[0].token_ids == expected[17]
    vanishing_top_p = SamplingParams(temperature=1.0, top_p=5e-324, max_tokens=10, ignore_eos=True, seed=1)
    assert llm.generate([random_prompt(17, seed=17)], vanishing_top_p)[0].outputs[0].token_ids == expected[17]


@pytest.mark.parametrize("max_model_len", [577, 1000, 2048])
def test_default_kv_budget_holds_one_full_length_sequence(max_model_len):
    """The smallest default budget (one sequence) must survive the planner's per-group split and rounding."""
    from atomlite.demo import demo_model_dir
    llm = LLM(str(demo_model_dir()), device="cpu", max_model_len=max_model_len, max_num_seqs=1)
    assert llm.engine.kv_plan.max_seqs_at_full_length >= 1
