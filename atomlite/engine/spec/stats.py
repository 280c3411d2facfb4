"""Acceptance counters, vLLM's spec_decode_* series: drafts (rounds that proposed at least one token), draft
tokens, accepted tokens, and accepted tokens by position in the draft."""
from dataclasses import dataclass, field


@dataclass
class SpecStats:
    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.accepted_per_pos = [0] * self.num_speculative_tokens

    def record(self, drafts: list[list[int]], runs: list[list[int]]) -> None:
        """Each sequence's drafts and its run (accepted drafts, then one more token)."""
        for proposed, run in zip(drafts, runs):
            self.num_drafts += 1
            self.num_draft_tokens += len(proposed)
            accepted = len(run) - 1
            self.num_accepted_tokens += accepted
            for position in range(accepted):
                self.accepted_per_pos[position] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verifying round: 1 + accepted drafts (vLLM's mean acceptance length)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def snapshot(self) -> "SpecStats":
        copy = SpecStats(self.num_speculative_tokens, self.num_drafts, self.num_draft_tokens,
                         self.num_accepted_tokens)
        copy.accepted_per_pos = list(self.accepted_per_pos)
        return copy
