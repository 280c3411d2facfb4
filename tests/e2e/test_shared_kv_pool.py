"""Every KV group draws on one pool of pages: under a budget planned for long sequences, short requests run by
what they hold, not by what a max-length sequence would, and give the tokens they give alone."""
from atomlite import LLM, SamplingParams
from atomlite.demo import demo_model_dir

PROMPTS = [f"Question: {a} + {b} = ?\nAnswer:" for a in range(8) for b in range(8)]  # 64 short prompts


def engine(**args) -> LLM:
    return LLM(str(demo_model_dir()), dtype="float32", device="cpu", **args)


def test_64_short_requests_run_together_under_a_budget_for_one_long_sequence():
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = engine(max_model_len=2048, kv_cache_memory="2MiB", max_num_seqs=64)
    plan = llm.engine.kv_plan
    assert plan.max_seqs_at_full_length == 1
    peak = []
    schedule = llm.engine.scheduler.schedule

    def counting_schedule():
        batch = schedule()
        peak.append(len(llm.engine.scheduler.running))
        return batch

    llm.engine.scheduler.schedule = counting_schedule
    loaded = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert max(peak) >= 3 * plan.max_seqs_at_full_length
    assert all(used == 0 for _, used, _ in llm.engine.kv.usage())
    alone = engine(max_model_len=2048, max_num_seqs=1)
    assert loaded == [alone.generate(p, params)[0].outputs[0].token_ids for p in PROMPTS]


def test_decode_runs_ahead_while_a_request_waits_that_cannot_be_admitted():
    """Two long requests fill the pool (27 pages: each reserves 13 for its prompt and 200 tokens); a third waits for
    room. The two keep decoding with steps launched ahead (the waiting one is known not to fit), and all three give
    the tokens they give alone. On CPU the decode steps run from the static buffers a graph would replay."""
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    prompts = ["Question: 1 + 1 = ?\nAnswer:", "Question: 2 + 2 = ?\nAnswer:", "Question: 3 + 3 = ?\nAnswer:"]
    llm = engine(max_model_len=256, kv_cache_memory=28 * 32 * 1024, max_num_seqs=8)
    assert llm.engine.kv_plan.page_bytes == 32 * 1024
    llm.engine.runner.use_decode_graphs(8, 256, capture=False)
    waiting_when_ahead = []
    run_ahead = llm.engine._run_ahead

    def counting_run_ahead(launched):
        waiting_when_ahead.append(len(llm.engine.scheduler.waiting))
        return run_ahead(launched)

    llm.engine._run_ahead = counting_run_ahead
    outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert waiting_when_ahead.count(1) > 100
    alone = engine(max_model_len=256, max_num_seqs=1)
    assert outputs == [alone.generate(p, params)[0].outputs[0].token_ids for p in prompts]
