"""The scheduler on its own, over a real KV cache manager of tiny specs: what it runs each step under the token
budget, what it admits, whom it preempts, and that every block comes back. `step` runs the engine's bookkeeping
(Scheduler.update_from_output) and stands in for the model only: it appends one token to each sequence whose prompt
is done."""
import pytest
import torch

from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.scheduler import Scheduler
from atomlite.engine.sequence import Sequence, Status
from atomlite.model_ops.kv_spec import KVSpec
from atomlite.sampling_params import SamplingParams

BLOCK = 4
FULL = KVSpec("full", 1, 4, torch.float32)
SLIDING = KVSpec("sliding", 1, 4, torch.float32, window=8)


def make_scheduler(num_blocks: int, specs=(FULL,), max_num_seqs: int = 8, max_num_batched_tokens: int = 64,
                   max_model_len: int = 1000, policy: str = "fcfs") -> Scheduler:
    """num_blocks usable pages, shared by the groups (the page of null blocks comes on top); the specs' blocks are
    of one size, so a page holds one block of any group."""
    kv = KVCacheManager(list(specs), num_blocks + 1, BLOCK, torch.device("cpu"))
    return Scheduler(kv, max_num_seqs, max_num_batched_tokens, max_model_len, policy)


def seq(prompt_len: int, max_tokens: int = 16, first: int = 0, **params) -> Sequence:
    return Sequence(list(range(first, first + prompt_len)), SamplingParams(max_tokens=max_tokens, **params))


def finish(sched: Scheduler, s: Sequence, reason: str) -> None:
    s.status, s.finish_reason = Status.FINISHED, reason
    sched.remove(s)


def step(sched: Scheduler) -> list[tuple[Sequence, int]]:
    batch = sched.schedule()
    sched.update_from_output(batch)
    for s, _ in batch:
        if s.num_uncomputed == 0:
            s.token_ids.append(10_000 + s.seq_id * 1000 + len(s.token_ids))
            if s.num_output_tokens >= s.params.max_tokens or len(s.token_ids) >= sched.max_model_len:
                finish(sched, s, "length")
    return batch


def used(sched: Scheduler) -> list[int]:
    return [g.pool.num_used for g in sched.kv.groups]


def test_decode_is_scheduled_before_waiting_prefills():
    sched = make_scheduler(num_blocks=32)
    a, b = seq(6), seq(6, first=100)
    sched.add(a)
    step(sched)
    sched.add(b)
    assert step(sched) == [(a, 1), (b, 6)]


def test_prefill_is_chunked_to_max_num_batched_tokens():
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=4)
    a = seq(10)
    sched.add(a)
    assert [step(sched) for _ in range(4)] == [[(a, 4)], [(a, 4)], [(a, 2)], [(a, 1)]]
    assert a.num_output_tokens == 2


def test_a_step_splits_its_token_budget_between_sequences_in_order():
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=8)
    a, b, c = seq(5), seq(5, first=100), seq(5, first=200)
    for s in (a, b, c):
        sched.add(s)
    assert step(sched) == [(a, 5), (b, 3)]
    assert step(sched) == [(a, 1), (b, 2), (c, 5)]


def test_running_sequences_never_exceed_max_num_seqs():
    sched = make_scheduler(num_blocks=32, max_num_seqs=2)
    seqs = [seq(3, first=100 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert step(sched) == [(seqs[0], 3), (seqs[1], 3)]
    assert list(sched.waiting) == [seqs[2]] and seqs[2].block_tables == []
    finish(sched, seqs[0], "stop")
    assert step(sched) == [(seqs[1], 1), (seqs[2], 3)]


def test_admission_keeps_room_for_running_sequences_to_grow():
    """Until a sequence finishes, admission reserves all of max_tokens: A (4 + 12 tokens) expects 4 blocks of
    5, so B (also 4 blocks) waits, holding nothing, and is admitted once A is gone."""
    sched = make_scheduler(num_blocks=5)
    a, b = seq(4, max_tokens=12), seq(4, max_tokens=12, first=100)
    sched.add(a)
    sched.add(b)
    assert step(sched) == [(a, 4)]
    assert list(sched.waiting) == [b] and b.block_tables == [] and b.num_computed_tokens == 0
    assert used(sched) == [1]
    finish(sched, a, "length")
    assert step(sched) == [(b, 4)]


def test_admission_reserves_only_the_share_of_max_tokens_that_finished_sequences_used():
    sched = make_scheduler(num_blocks=5)
    early = seq(4, max_tokens=12, first=500)
    sched.add(early)
    step(sched)
    finish(sched, early, "stop")  # used 1 of 12
    assert sched.output_share.mean == 1 / 12
    a, b = seq(4, max_tokens=12), seq(4, max_tokens=12, first=100)
    sched.add(a)
    sched.add(b)
    assert step(sched) == [(a, 4), (b, 4)]


def test_admission_expects_no_output_past_max_model_len():
    """max_tokens 1000 under a 16-token context: each sequence expects 4 blocks, so two fit in 8."""
    sched = make_scheduler(num_blocks=8, max_model_len=16)
    a, b = seq(4, max_tokens=1000), seq(4, max_tokens=1000, first=100)
    sched.add(a)
    sched.add(b)
    assert step(sched) == [(a, 4), (b, 4)]


def test_aborted_sequences_do_not_teach_admission():
    sched = make_scheduler(num_blocks=5)
    early = seq(4, max_tokens=12)
    sched.add(early)
    step(sched)
    finish(sched, early, "abort")
    assert sched.output_share.mean == 1.0


def test_preempted_sequence_frees_every_block_and_requeues_first():
    """With a learned share of 1/100, A and B (4-token prompts) are admitted into 4 blocks and outgrow them: A's
    third block preempts B, the later admitted, which gives back both of its blocks and goes before C."""
    sched = make_scheduler(num_blocks=4)
    early = seq(4, max_tokens=100, first=500)
    sched.add(early)
    step(sched)
    finish(sched, early, "stop")
    a, b, c = seq(4, max_tokens=100), seq(4, max_tokens=100, first=100), seq(4, first=200)
    sched.add(a)
    sched.add(b)
    assert step(sched) == [(a, 4), (b, 4)]
    for _ in range(4):
        assert step(sched) == [(a, 1), (b, 1)]
    share = sched.output_share.mean
    sched.add(c)
    assert step(sched) == [(a, 1)]  # nothing is admitted in a step that preempted
    assert sched.num_preemptions == 1 and sched.running == [a]
    assert list(sched.waiting) == [b, c]
    assert b.status == Status.WAITING and b.block_tables == [] and b.num_computed_tokens == 0
    assert used(sched) == [len(a.block_tables[0])] == [3]
    assert sched.output_share.mean > share  # a preemption counts as a sequence that used all of max_tokens


def test_preempted_sequence_recomputes_its_outputs_from_its_cached_prefix():
    sched = make_scheduler(num_blocks=4)
    early = seq(4, max_tokens=100, first=500)
    sched.add(early)
    step(sched)
    finish(sched, early, "stop")
    a, b = seq(4, max_tokens=100), seq(4, max_tokens=100, first=100)
    sched.add(a)
    sched.add(b)
    for _ in range(6):
        step(sched)
    assert sched.num_preemptions == 1
    tokens = list(b.token_ids)
    finish(sched, a, "stop")
    assert sched.schedule() == [(b, len(tokens) - BLOCK)]  # its first block is cached; outputs are recomputed
    assert b.num_cached_tokens == BLOCK and b.token_ids == tokens
    assert sched.prefix_cache_hits == BLOCK


def test_lone_prefill_chunk_halves_until_its_blocks_fit():
    """Sliding window 8 in 3 blocks: the first 24-token chunk cannot fit, 12 can; after it only one block is
    free, so the next chunk shrinks to 3 tokens instead of preempting the only sequence."""
    sched = make_scheduler(num_blocks=3, specs=(SLIDING,), max_num_batched_tokens=24)
    a = seq(24)
    sched.add(a)
    assert step(sched) == [(a, 12)]
    assert step(sched) == [(a, 3)]
    while a.num_output_tokens == 0:
        step(sched)
    assert sched.num_preemptions == 0 and a.num_computed_tokens == 24


def test_prefix_hit_reuses_blocks_and_counts_cached_tokens():
    sched = make_scheduler(num_blocks=32)
    a = seq(10)
    sched.add(a)
    step(sched)
    b = Sequence(list(range(8)) + [77, 78, 79], SamplingParams())
    sched.add(b)
    assert step(sched) == [(a, 1), (b, 3)]
    assert b.num_cached_tokens == 8
    assert b.block_tables[0][:2] == a.block_tables[0][:2]
    assert all(sched.kv.groups[0].pool.refs[blk] == 2 for blk in a.block_tables[0][:2])
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (10 + 11, 8)


def test_prompt_logprobs_requests_compute_the_whole_prompt():
    sched = make_scheduler(num_blocks=32)
    a = seq(10)
    sched.add(a)
    step(sched)
    b = seq(10, prompt_logprobs=1)
    sched.add(b)
    assert step(sched) == [(a, 1), (b, 10)]
    assert b.num_cached_tokens == 0 and sched.prefix_cache_queries == 10


def test_freed_sequences_return_all_blocks():
    """Twelve requests of mixed lengths through a small full + sliding cache, with preemptions (the first
    requests stop at their first token, so admission learns to reserve little) and aborts of a waiting and a
    running sequence: every step keeps to its limits and, at the end, every block is free."""
    sched = make_scheduler(num_blocks=12, specs=(FULL, SLIDING), max_num_seqs=4, max_num_batched_tokens=10,
                           max_model_len=64)
    seqs = [seq(3 + 5 * (i % 4), max_tokens=4 + 7 * (i % 3), first=100 * (i % 5)) for i in range(12)]
    for s in seqs:
        sched.add(s)
    finish(sched, seqs[-1], "abort")  # still waiting
    steps = 0
    while sched.has_work():
        batch = step(sched)
        steps += 1
        for s in seqs[:3]:
            if s.num_output_tokens == 1 and not s.is_finished:
                finish(sched, s, "stop")
        assert sum(n for _, n in batch) <= 10 and len(sched.running) <= 4
        if steps == 5:
            finish(sched, sched.running[0], "abort")
        assert steps < 500
    assert sched.num_preemptions > 0
    assert used(sched) == [0, 0]
    assert all(refs == 0 for g in sched.kv.groups for refs in g.pool.refs)
    assert [s.finish_reason for s in seqs[:3]] == ["stop"] * 3
    assert sum(s.finish_reason == "length" for s in seqs) == 7
    assert all(s.num_output_tokens == s.params.max_tokens for s in seqs if s.finish_reason == "length")


def test_a_refused_head_is_not_tried_again_until_room_can_have_changed():
    """B is refused for room while A runs: later steps skip admission (no prefix lookup, no allocation) and say
    that nobody will be admitted, so decode may run ahead; once A leaves, B is admitted."""
    sched = make_scheduler(num_blocks=5)
    a, b = seq(4, max_tokens=12), seq(4, max_tokens=12, first=100)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert sched.admission_refused()
    tries = []
    sched.kv.apply_prefix_hit = lambda s: tries.append(s) or 0
    for _ in range(3):
        assert step(sched) == [(a, 1)]
    assert tries == [] and sched.admission_refused()
    finish(sched, a, "length")
    assert not sched.admission_refused()
    assert step(sched) == [(b, 4)] and tries == [b]


def test_a_new_head_is_tried_even_after_a_refusal():
    """Under the priority policy a later, more urgent request goes to the head and is tried at once."""
    sched = make_scheduler(num_blocks=5, policy="priority")
    a, b = seq(4, max_tokens=12), seq(4, max_tokens=12, first=100)
    urgent = Sequence(list(range(200, 204)), SamplingParams(max_tokens=1), priority=-1)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert sched.admission_refused()
    sched.add(urgent)
    assert list(sched.waiting) == [urgent, b] and not sched.admission_refused()


def test_priority_policy_runs_lower_values_first_and_ties_by_arrival():
    sched = make_scheduler(num_blocks=40, max_num_seqs=1, policy="priority")
    late, first, tie_a, tie_b = (Sequence(list(range(i * 10, i * 10 + 4)), SamplingParams(max_tokens=1),
                                          priority=p) for i, p in enumerate([5, -3, 0, 0]))
    for s in (late, tie_a, first, tie_b):
        sched.add(s)
    order = []
    while sched.has_work():
        for s, _ in step(sched):
            if s not in order:
                order.append(s)
    assert order == [first, tie_a, tie_b, late]


def test_priority_policy_preempts_the_least_urgent_not_the_latest():
    """The priority-9 sequence runs first, then two more urgent ones join and the three fill the cache; when they
    each need a second block, the priority-9 one is preempted (fcfs would take the latest admitted)."""
    sched = make_scheduler(num_blocks=3, policy="priority")
    for _ in range(sched.output_share.recent.maxlen):
        sched.output_share.record(0.0)  # admit as if nothing grows: the cache fills, and growth must preempt
    lazy, *urgent = [Sequence(list(range(i * 10, i * 10 + 3)), SamplingParams(max_tokens=8), priority=p)
                     for i, p in enumerate([9, 0, 1])]
    sched.add(lazy)
    step(sched)
    for s in urgent:
        sched.add(s)
    step(sched)
    assert sched.running == [lazy, *urgent]
    step(sched)
    assert sched.num_preemptions == 1 and list(sched.waiting) == [lazy] and lazy.block_tables == []


def test_scheduler_refuses_an_unknown_policy():
    with pytest.raises(ValueError, match="scheduling policy 'lifo'"):
        make_scheduler(num_blocks=4, policy="lifo")


def cached_prefix(sched: Scheduler, prompt: list[int]) -> int:
    """Tokens of prompt a new sequence would find in the prefix cache (its blocks go back at once)."""
    probe = Sequence(prompt, SamplingParams())
    hit = sched.kv.apply_prefix_hit(probe)
    sched.kv.free(probe)
    return hit


def test_a_step_launched_ahead_computes_a_position_and_keys_it_once_its_token_is_in():
    """Overlapped decode: advance_ahead counts the in-flight token's position computed; the block that token
    completes becomes findable in the prefix cache only with settle_ahead, after the token is appended."""
    sched = make_scheduler(num_blocks=32, specs=(FULL, SLIDING))
    a = seq(6)
    sched.add(a)
    step(sched)  # 6 computed, its first output token appended: 7 tokens
    batch = sched.schedule()
    assert batch == [(a, 1)]
    sched.update_from_output(batch)  # position 6 computed; the token sampled from it is still on the device
    assert sched.kv.allocate(a, 1)
    sched.advance_ahead([a])  # position 7 (the in-flight token's) computed
    assert a.num_computed_tokens == 8 and len(a.token_ids) == 7
    a.token_ids.append(555)
    assert cached_prefix(sched, a.token_ids + [1]) == BLOCK
    sched.settle_ahead([a])
    assert cached_prefix(sched, a.token_ids + [1]) == 2 * BLOCK


def test_settling_verified_drafts_advances_by_the_accepted_drafts_and_one_token():
    """Two drafts verified: the step computed the last token and both drafts; with one draft accepted and one
    token after it, the sequence advanced by two; a sequence finished meanwhile does not advance."""
    sched = make_scheduler(num_blocks=32)
    a, b = seq(6), seq(6, first=100)
    for s in (a, b):
        sched.add(s)
    step(sched)
    for s in (a, b):
        s.spec_token_ids = [900, 901]
    batch = sched.schedule()
    assert batch == [(a, 3), (b, 3)]
    sched.update_from_output(batch, verifying={a.seq_id, b.seq_id})
    assert a.num_computed_tokens == b.num_computed_tokens == 6
    a.token_ids += [900, 42]  # one draft accepted, then its own token
    b.status = Status.FINISHED
    assert sched.settle_verified([a, b]) == [1, 0]
    assert a.num_computed_tokens == 8 and b.num_computed_tokens == 6
    assert a.spec_token_ids == b.spec_token_ids == []
