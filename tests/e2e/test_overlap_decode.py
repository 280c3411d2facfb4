"""Overlapped decode: the next decode step launched before the host reads this one's tokens (its input ids stay on
the device) must give exactly the tokens, logprobs and KV bookkeeping of reading each step first.

On CPU the steps run from the static decode buffers (what a graph replays) without capture, so the launch-ahead
path runs here as it does on a GPU, only without the overlap in time.
"""
import pytest

from atomlite import LLM, SamplingParams
from helpers import admit_optimistically, greedy, random_prompt

ARGS = dict(dtype="float32", device="cpu")


def _prompts(count: int) -> list[list[int]]:
    return [random_prompt(3 + (7 * i) % 19, seed=300 + i) for i in range(count)]


def _static_llm(path, overlap: bool, optimistic: bool = False, **settings) -> tuple[LLM, list[int]]:
    """An engine whose decode steps run from the static buffers; the list counts the steps launched ahead."""
    llm = LLM(str(path), overlap_decode=overlap, **ARGS, **settings)
    if optimistic:
        admit_optimistically(llm)
    runner = llm.engine.runner
    runner.use_decode_graphs(8, llm.engine.config.max_model_len, capture=False)
    ahead, run_ahead = [], runner.execute_ahead
    runner.execute_ahead = lambda seqs, ids: (ahead.append(len(seqs)), run_ahead(seqs, ids))[1]
    return llm, ahead


def _outputs(llm: LLM, params: list[SamplingParams]) -> list[tuple]:
    outs = llm.generate(_prompts(len(params)), params)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].finish_reason) for o in outs]


def _compare(path, params: list[SamplingParams], preempting: bool = False, **settings) -> list[int]:
    """Asserts both settings give the same outputs and free every block, and that most output tokens came from
    steps launched ahead: where something kept the engine from running ahead (a sequence waiting, a check
    refusing), the comparison would be of the plain path with itself. Returns the steps launched ahead."""
    reading_first, _ = _static_llm(path, overlap=False, optimistic=preempting, **settings)
    overlapped, ahead = _static_llm(path, overlap=True, optimistic=preempting, **settings)
    outputs = _outputs(overlapped, params)
    assert outputs == _outputs(reading_first, params)
    # each sequence's first token comes from its prefill and its last is never launched ahead (it may end it)
    assert sum(ahead) >= 0.7 * sum(len(tokens) for tokens, _, _ in outputs)
    if preempting:
        assert overlapped.engine.scheduler.num_preemptions > 0
    assert all(used == 0 for _, used, _ in overlapped.engine.kv.usage())
    assert overlapped.engine._ahead is None
    return ahead


def test_overlapped_greedy_decode_as_sequences_finish_mid_batch(checkpoints):
    path, _ = checkpoints.get("dense")
    ahead = _compare(path, [greedy(6 + 3 * i, logprobs=2) for i in range(5)])
    assert ahead and max(ahead) == 5 and min(ahead) == 1


def test_overlapped_seeded_sampling(checkpoints):
    path, _ = checkpoints.get("dense")
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=11 + i, max_tokens=12) for i in range(3)]
    assert _compare(path, params)


def test_a_stop_token_ends_a_sequence_whose_next_step_already_ran(checkpoints):
    """A stop token is only known once read: the step launched ahead for that sequence is dropped, its blocks
    freed, and the other sequences go on."""
    path, _ = checkpoints.get("dense")
    plain = _outputs(_static_llm(path, overlap=False)[0], [greedy(16) for _ in range(3)])
    stop = plain[1][0][5]  # sequence 1 stops at its 6th token (or earlier where that token came before)
    ahead = _compare(path, [greedy(16, stop_token_ids=[stop]) for _ in range(3)])
    assert ahead


def test_overlapped_decode_on_the_ple_kv_sharing_model(checkpoints):
    path, _ = checkpoints.get("ple")
    assert _compare(path, [greedy(40) for _ in range(2)], block_size=4)


def test_overlapped_decode_under_preemption(checkpoints):
    path, _ = checkpoints.get("dense")
    settings = dict(kv_cache_memory=2 * 72 * 1024, block_size=4, max_model_len=64)
    _compare(path, [greedy(20 + i) for i in range(5)], preempting=True, **settings)


def test_abort_while_a_step_runs_ahead(checkpoints):
    path, _ = checkpoints.get("dense")
    llm, ahead = _static_llm(path, overlap=True)
    engine = llm.engine
    seqs = [engine.add_request(str(i), prompt, greedy(30)) for i, prompt in enumerate(_prompts(2))]
    while engine._ahead is None:
        engine.step()
    tokens_at_abort = len(seqs[0].token_ids)
    engine.abort("0")
    while engine.has_unfinished():
        engine.step()
    assert len(seqs[0].token_ids) == tokens_at_abort and seqs[0].finish_reason == "abort"
    assert seqs[1].num_output_tokens == 30
    assert all(used == 0 for _, used, _ in engine.kv.usage())


def test_no_step_runs_ahead_without_decode_graphs(checkpoints):
    llm = LLM(str(checkpoints.get("dense")[0]), **ARGS)  # CPU: no graphs, no static buffers
    llm.generate(_prompts(2), [greedy(5)] * 2)
    assert llm.engine.runner.graphs is None and llm.engine._ahead is None


def test_no_step_runs_ahead_when_turned_off(checkpoints):
    llm, ahead = _static_llm(checkpoints.get("dense")[0], overlap=False)
    llm.generate(_prompts(2), [greedy(5)] * 2)
    assert not ahead


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_added_while_a_step_runs_ahead(checkpoints, overlap):
    """As the server adds requests between steps: the step ahead is taken first, then the newcomer is scheduled
    (no step runs ahead while it waits); both get the tokens they get when submitted together."""
    path, _ = checkpoints.get("dense")
    together = [o.outputs[0].token_ids for o in LLM(str(path), **ARGS).generate(_prompts(2), [greedy(12)] * 2)]
    llm, ahead = _static_llm(path, overlap=overlap)
    engine = llm.engine
    first = engine.add_request("0", _prompts(2)[0], greedy(12))
    for _ in range(4):
        engine.step()
    assert (engine._ahead is not None) == overlap
    second = engine.add_request("1", _prompts(2)[1], greedy(12))
    while engine.has_unfinished():
        engine.step()
    assert [first.output_token_ids, second.output_token_ids] == together
    assert bool(ahead) == overlap
    assert all(used == 0 for _, used, _ in engine.kv.usage())
