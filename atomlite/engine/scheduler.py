"""Continuous batching under a token budget: running sequences first (decode or their next prefill chunk),
then waiting ones.

A waiting sequence is admitted only while the KV cache keeps room for every running sequence (and itself) to grow
to its expected length: its prompt plus the share of max_tokens that finished sequences have used so far (all of
it until one finishes). When blocks still run out, the most recently admitted sequence is preempted and later
recomputed (its prefix may come back from the prefix cache); each preemption counts as a sequence that used all
of its max_tokens, so admission grows more careful instead of preempting the same prompts again and again.

The policy orders the waiting queue and picks whom to preempt: "fcfs" (arrival order; the most recently admitted
is preempted) or "priority" (lower priority values first, ties by arrival; the latest of the lowest priority is
preempted), as vLLM's --scheduling-policy.

Admitting costs a look at every running sequence, so a refusal for room is remembered: the queue's head is not
tried again until room can have changed (a sequence left or was preempted, or another came to the head)."""
import bisect
import math
import time
from collections import deque

from atomlite.config import SCHEDULING_POLICIES
from atomlite.engine.images.image_budget import ImageScheduling, StepImageBudget
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.sequence import Sequence, Status


class OutputShare:
    """The mean share of max_tokens that recent sequences used (1.0 until one finishes)."""

    def __init__(self, window: int = 128):
        self.recent: deque[float] = deque(maxlen=window)

    def record(self, share: float) -> None:
        self.recent.append(min(1.0, share))

    @property
    def mean(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else 1.0


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 policy: str = "fcfs", images: ImageScheduling | None = None, max_loras: int | None = None):
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy {policy!r} is not one of {', '.join(SCHEDULING_POLICIES)}")
        self.policy = policy
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.images = images or ImageScheduling(max_num_batched_tokens)
        self.max_loras = max_loras  # distinct LoRA adapters the running sequences may use (None: LoRA off)
        self.output_share = OutputShare()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_cache_queries = self.prefix_cache_hits = 0  # tokens looked up and found, at admission
        self.room_changes = 0  # counts the events after which a refused head may fit
        self._refused: tuple[Sequence, int] | None = None  # (head, room_changes) when it was refused for room

    def add(self, seq: Sequence) -> None:
        self._queue(seq, front=False)

    def _queue(self, seq: Sequence, front: bool) -> None:
        if self.policy == "priority":
            bisect.insort(self.waiting, seq, key=_priority_order)
        elif front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def admission_refused(self) -> bool:
        """Whether the next schedule() is sure to admit nobody: the queue's head was refused for room and nothing
        since could have made room, or every sequence slot is taken."""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return True
        return self._refused is not None and self._refused == (self.waiting[0], self.room_changes)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and give its blocks back."""
        if seq.finish_reason in ("stop", "length"):
            self.output_share.record(seq.num_output_tokens / max(1, self._output_limit(seq)))
        self.room_changes += 1
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)

    def schedule(self) -> list[tuple[Sequence, int]]:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preemptions_before = self.num_preemptions
        images = self.images.step()
        running, i = self.running, 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed, drafts = seq.num_computed_tokens, seq.spec_token_ids
            uncomputed = len(seq.token_ids) - computed
            num_new = uncomputed + len(drafts) if drafts else uncomputed
            num_new = num_new if num_new < budget else budget
            if seq.images:
                num_new = images.fit(seq, num_new)
                if num_new == 0:  # its next image waits for a step with room for it whole
                    i += 1
                    continue
            if computed + num_new > seq.kv_covered_tokens:  # else its blocks hold the step already
                num_new = self._fit_running(seq, num_new, images)
                if num_new == 0:
                    break
            if seq.images:
                images.take(seq, num_new)
            if drafts:
                del drafts[max(0, num_new - uncomputed):]  # drafts past the budget are dropped
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1
        if self.num_preemptions == preemptions_before:
            self._admit_waiting(scheduled, budget, images)
        return scheduled

    # -- after a step: the one place a sequence advances ------------------------------------------------------
    def advance(self, seq: Sequence, num_tokens: int, token_known: bool = True) -> None:
        """seq's KV now holds num_tokens more positions: they count as computed, blocks the window no longer sees
        go, and (token_known: every token they hold is on the host) its new full blocks get prefix-cache keys."""
        seq.num_computed_tokens += num_tokens
        if token_known:
            self.kv.update_block_hashes(seq)
        self.kv.release_out_of_window(seq)

    def update_from_output(self, batch: list[tuple[Sequence, int]], verifying: set[int] = frozenset()) -> None:
        """After a step's forward: each scheduled sequence computed the tokens it was given, except those that
        verified drafts (seq_id in verifying), whose computed count is known once their drafts are decided
        (settle_verified)."""
        for seq, num_new in batch:
            if seq.seq_id not in verifying:
                self.advance(seq, num_new)

    def advance_ahead(self, seqs: list[Sequence]) -> None:
        """A decode step launched before the tokens it reads reached the host (overlapped decode): each sequence
        computes one more position; its keys wait for that token (settle_ahead)."""
        for seq in seqs:
            self.advance(seq, 1, token_known=False)

    def settle_ahead(self, seqs: list[Sequence]) -> None:
        """The tokens a step launched ahead read are on the host: its sequences' new full blocks get their keys."""
        for seq in seqs:
            self.kv.update_block_hashes(seq)

    def settle_verified(self, seqs: list[Sequence]) -> list[int]:
        """After a step that verified drafts, its tokens appended: each sequence computed its accepted drafts and
        the token before them; the rejected drafts' KV entries are left to be overwritten. Returns how many drafts
        each accepted (0 for a sequence that finished, which advances no more)."""
        accepted = []
        for seq in seqs:
            seq.spec_token_ids = []
            if seq.is_finished:
                accepted.append(0)
                continue
            accepted.append(len(seq.token_ids) - 2 - seq.num_computed_tokens)  # its run: drafts, then one token
            self.advance(seq, 1 + accepted[-1])
        return accepted

    def _fit_running(self, seq: Sequence, num_new: int, images: StepImageBudget) -> int:
        """Allocate for seq, preempting later sequences (then shrinking a lone chunk); 0 if seq itself yielded.
        Drafts never cost another sequence its blocks: where they do not fit, seq goes on without them."""
        if seq.spec_token_ids and not self.kv.allocate(seq, num_new):
            seq.spec_token_ids = []
            num_new = min(num_new, seq.num_uncomputed)
        while not self.kv.allocate(seq, num_new):
            victim = self._victim()
            if victim is not seq:
                self._preempt(victim)
            elif num_new > 1 and images.fit(seq, num_new // 2):
                num_new = images.fit(seq, num_new // 2)
            else:
                self._preempt(seq)
                return 0
        return num_new

    def _victim(self) -> Sequence:
        if self.policy == "priority":
            return max(reversed(self.running), key=_priority_order)
        return self.running[-1]

    def _output_limit(self, seq: Sequence) -> int:
        """The most output tokens seq may have: its max_tokens, or fewer where the context length ends first."""
        return min(seq.params.max_tokens, self.max_model_len - seq.num_prompt_tokens)

    def _growth(self, seq: Sequence, share: float) -> list[int]:
        """Per KV group, the blocks seq is expected to add to those it holds: for the rest of its prompt, and for
        `share` of the output tokens it may still have."""
        remaining = self._output_limit(seq) - seq.num_output_tokens
        expected = len(seq.token_ids) + math.ceil(share * max(0, remaining))
        return [max(0, e - n) for e, n in zip(self.kv.blocks_held(expected), self.kv.blocks_allocated(seq))]

    def _reserved(self, share: float) -> list[int]:
        total = [0] * len(self.kv.groups)
        for seq in self.running:
            total = [t + g for t, g in zip(total, self._growth(seq, share))]
        return total

    def _admit_waiting(self, scheduled: list, budget: int, images: StepImageBudget) -> None:
        if not self.waiting or self.admission_refused():
            return
        share = self.output_share.mean
        reserved = self._reserved(share)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._adapter_fits(seq):  # it waits for a running sequence's adapter slot to be given up
                self._refused = (seq, self.room_changes)
                return
            if seq.params.prompt_logprobs is None:
                self.kv.apply_prefix_hit(seq)
            num_new = images.fit(seq, min(seq.num_uncomputed, budget))
            if num_new == 0:  # its first image waits for a step with room for it whole
                self.kv.free(seq)
                seq.reset_for_recompute()
                return
            allocated = self.kv.allocate(seq, num_new)
            while not allocated and not self.running and num_new > 1:
                num_new = images.fit(seq, num_new // 2)  # alone, a smaller first chunk must fit (the planner
                allocated = num_new > 0 and self.kv.allocate(seq, num_new)  # sized the cache for one)
            growth = self._growth(seq, share) if allocated else []
            if not allocated or (self.running and not self.kv.fits([r + g for r, g in zip(reserved, growth)])):
                self.kv.free(seq)  # it waits, holding nothing: the running sequences need the room to grow
                seq.reset_for_recompute()
                if self.running:  # alone it is tried again each step: no sequence will leave to make room
                    self._refused = (seq, self.room_changes)
                return
            reserved = [r + g for r, g in zip(reserved, growth)]
            self.waiting.popleft()
            self._admitted(seq)
            images.take(seq, num_new)
            scheduled.append((seq, num_new))
            budget -= num_new

    def _adapter_fits(self, seq: Sequence) -> bool:
        if seq.lora is None:
            return True
        adapters = {(s.lora.lora_int_id, s.lora.lora_path) for s in self.running if s.lora is not None}
        return (seq.lora.lora_int_id, seq.lora.lora_path) in adapters or len(adapters) < self.max_loras

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
        self._queue(seq, front=True)
        self.num_preemptions += 1
        self.room_changes += 1
        self.output_share.record(1.0)


def _priority_order(seq: Sequence) -> tuple[int, float]:
    return seq.priority, seq.arrival_time
