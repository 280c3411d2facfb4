"""A step whose sampled token ids are on their way to the host.

The ids are copied from the device without waiting; the host reads them only when it needs them, so it can launch
the next decode step first (the engine's overlapped decode: the GPU computes that step during the host's work on
this one).
"""
from dataclasses import dataclass

import torch

from atomlite.engine.sequence import Sequence


@dataclass
class LaunchedStep:
    seqs: list[Sequence]  # one per sampled row, in row order
    ids: torch.Tensor  # [len(seqs)] int64 on the logits' device: a step launched ahead reads them as its input
    logprobs: torch.Tensor | None  # [len(seqs), vocab] log_softmax of the logits, where a sequence asked for them
    _host_ids: torch.Tensor
    _copied: torch.cuda.Event | None

    @classmethod
    def start(cls, seqs: list[Sequence], ids: torch.Tensor, logprobs: torch.Tensor | None) -> "LaunchedStep":
        if ids.device.type != "cuda":
            return cls(seqs, ids, logprobs, ids, None)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return cls(seqs, ids, logprobs, host, copied)

    def tokens(self) -> list[int]:
        """The sampled ids, once the copy has landed (waits for the step's GPU work)."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._host_ids.tolist()

    def runs(self) -> list[list[int]]:
        """Each sequence's new tokens: one each."""
        return [[token] for token in self.tokens()]

    def logprobs_of(self, i: int, j: int) -> torch.Tensor:
        return self.logprobs[i]


@dataclass
class VerifiedStep:
    """A step whose sequences may each get several tokens (accepted drafts, then one more), decided on the host
    already: nothing runs ahead of a step that verifies drafts, since the next drafts depend on what it accepts."""
    seqs: list[Sequence]
    token_runs: list[list[int]]
    first_rows: list[int]  # each sequence's first logit row: its run's token j came from row first + j
    logprobs: torch.Tensor | None  # [rows, vocab] log_softmax of the step's logits, where a sequence asked for them
    verified: list[Sequence]  # the sequences that verified drafts (their computed tokens are settled after)

    def runs(self) -> list[list[int]]:
        return self.token_runs

    def logprobs_of(self, i: int, j: int) -> torch.Tensor:
        return self.logprobs[self.first_rows[i] + j]
