"""Continuous batching under a token budget: running sequences first (decode or their next prefill chunk),
then waiting ones. When KV blocks run out, the most recently admitted sequence is preempted and later
recomputed (its prefix may come back from the prefix cache)."""
import time
from collections import deque

from atomlite.engine.kv_cache import KVCacheManager
from atomlite.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_cache_queries = self.prefix_cache_hits = 0  # tokens looked up and found, at admission

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and give its blocks back."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)

    def schedule(self) -> list[tuple[Sequence, int]]:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preemptions_before = self.num_preemptions
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = self._fit_running(seq, min(seq.num_uncomputed, budget))
            if num_new == 0:
                break
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1
        if self.num_preemptions == preemptions_before:
            self._admit_waiting(scheduled, budget)
        return scheduled

    def _fit_running(self, seq: Sequence, num_new: int) -> int:
        """Allocate for seq, preempting later sequences (then shrinking a lone chunk); 0 if seq itself yielded."""
        while not self.kv.allocate(seq, num_new):
            victim = self.running[-1]
            if victim is not seq:
                self._preempt(victim)
            elif num_new > 1:
                num_new //= 2
            else:
                self._preempt(seq)
                return 0
        return num_new

    def _admit_waiting(self, scheduled: list, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.params.prompt_logprobs is None:
                self.kv.apply_prefix_hit(seq)
            num_new = min(seq.num_uncomputed, budget)
            allocated = self.kv.allocate(seq, num_new)
            while not allocated and not self.running and num_new > 1:
                num_new //= 2  # alone, a smaller first chunk must fit (the planner sized the cache for one)
                allocated = self.kv.allocate(seq, num_new)
            if not allocated:
                self.kv.free(seq)
                seq.reset_for_recompute()
                return
            self.waiting.popleft()
            self._admitted(seq)
            scheduled.append((seq, num_new))
            budget -= num_new

    def _admitted(self, seq: Sequence) -> None:
        if self.kv.enable_prefix_caching and seq.params.prompt_logprobs is None:
            self.prefix_cache_queries += len(seq.token_ids)
            self.prefix_cache_hits += seq.num_cached_tokens
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        seq.status = Status.RUNNING
        self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
