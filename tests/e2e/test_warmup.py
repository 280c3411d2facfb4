"""The startup warm-up runs mixed steps at every token count a step can have (the kernels' row-count variants)
and gives every block back."""
from atomlite import LLM
from atomlite.engine.runner.warmup import warm_up, warmup_token_counts


def test_token_counts_straddle_each_power_of_two_up_to_the_budget():
    counts = warmup_token_counts(2048)
    assert counts[:8] == list(range(1, 9)) and counts[-2:] == [2047, 2048]
    for power in (16, 32, 64, 128, 256, 512, 1024):
        assert {power - 1, power, power + 1} <= set(counts)
    assert max(warmup_token_counts(100)) == 100 and 129 not in warmup_token_counts(100)


def test_warm_up_runs_each_count_and_frees_its_blocks(checkpoints):
    path, _ = checkpoints.get("dense")
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64, block_size=4)
    engine, seen = llm.engine, []
    execute = engine.runner.execute
    engine.runner.execute = lambda batch: (seen.append(sum(n for _, n in batch)), execute(batch))[1]
    note = warm_up(engine.runner, engine.kv, 80, 30, engine.device)  # on CPU the engine itself skips it
    assert seen == warmup_token_counts(80) and "mixed steps of 1..80 tokens" in note  # 80: prompts of 30, 30, 16
    assert all(used == 0 for _, used, _ in engine.kv.usage())
