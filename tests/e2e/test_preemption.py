"""Admission under a small KV cache: the running sequences keep room to grow, so prompts are not preempted and
recomputed over and over; the tokens stay those of a cache that holds everything."""
from atomlite import LLM, SamplingParams
from atomlite.benchmarks.offline import throughput_batch
from atomlite.engine.kv import kv_planner
from helpers import random_prompt

PROMPT_LEN, MAX_TOKENS, BLOCK = 20, 24, 4


def budget_for(llm: LLM, num_seqs: int, seq_len: int) -> int:
    """Bytes of a KV cache that holds num_seqs sequences of seq_len tokens (and the page of null blocks)."""
    return kv_planner.budget_for(llm.engine.kv_specs, BLOCK, seq_len, num_seqs)


def generate(llm: LLM, count: int) -> list[list[int]]:
    prompts = [random_prompt(PROMPT_LEN, seed=i) for i in range(count)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_48_requests_in_a_cache_for_6_finish_with_few_preemptions(checkpoints):
    path, _ = checkpoints.get("dense")
    args = dict(dtype="float32", device="cpu", block_size=BLOCK, max_model_len=64, max_num_seqs=48)
    roomy = LLM(str(path), **args)
    expected = generate(roomy, 48)
    small = LLM(str(path), kv_cache_memory=budget_for(roomy, 6, PROMPT_LEN + MAX_TOKENS), **args)
    assert generate(small, 48) == expected
    assert small.engine.scheduler.num_preemptions <= 2
    assert all(used == 0 for _, used, _ in small.engine.kv.usage())


def test_admission_learns_how_much_of_max_tokens_requests_use(checkpoints):
    """Requests that stop at their first token teach admission to reserve less than their max_tokens, so more of
    them run at once than full reservations would allow."""
    path, _ = checkpoints.get("dense")
    args = dict(dtype="float32", device="cpu", block_size=BLOCK, max_model_len=64, max_num_seqs=48)
    roomy = LLM(str(path), **args)
    prompts = [random_prompt(6, seed=i) for i in range(40)]
    first = [o.outputs[0].token_ids[0] for o in roomy.generate(prompts, SamplingParams(temperature=0, max_tokens=1))]
    llm = LLM(str(path), kv_cache_memory=budget_for(roomy, 6, 6 + 40), **args)
    scheduler, batches = llm.engine.scheduler, []
    schedule = scheduler.schedule
    scheduler.schedule = lambda: (batch := schedule(), batches.append(len(batch)))[0]
    outs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[t]) for t in first])
    assert all(len(o.outputs[0].token_ids) == 1 for o in outs)
    assert scheduler.output_share.mean < 0.1
    assert batches[0] <= 6 < max(batches), batches


def test_throughput_roofline_batch_is_what_the_cache_holds(checkpoints):
    path, _ = checkpoints.get("dense")
    args = dict(dtype="float32", device="cpu", block_size=BLOCK, max_model_len=64, max_num_seqs=32)
    roomy = LLM(str(path), **args)
    small = LLM(str(path), kv_cache_memory=budget_for(roomy, 5, 40), **args)
    fit = small.engine.kv_plan.seqs_that_fit(40)
    assert 3 <= fit <= 5  # the planner splits the budget by each group's share of a max_model_len sequence
    assert throughput_batch(small.engine, num_prompts=100, seq_len=40) == fit
    assert throughput_batch(roomy.engine, num_prompts=100, seq_len=40) == 32
    assert throughput_batch(roomy.engine, num_prompts=3, seq_len=40) == 3
