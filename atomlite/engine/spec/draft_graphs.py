"""An assistant's k draft steps replayed from graphs, one per batch bucket, like decode steps (decode_graphs): the
draft context (each sequence's newest token at its position, the target's keys before it) goes into static
buffers, the target's hidden states into one more, and every step's guess feeds the next inside the graph."""
import torch

from atomlite.engine.runner.decode_graphs import DecodeGraphs
from atomlite.engine.sequence import Sequence
from atomlite.engine.runner.step_inputs import StepInputBuilder


class DraftGraphs(DecodeGraphs):
    def __init__(self, assistant, builder: StepInputBuilder, max_batch: int, max_model_len: int, num_drafts: int,
                 hidden_size: int, dtype: torch.dtype, capture: bool = True):
        super().__init__(assistant, builder, max_batch, max_model_len, capture)
        self.label = f"Draft graphs ({num_drafts} steps)"
        self.num_drafts = num_drafts
        self.hidden_in = torch.zeros((max_batch, hidden_size), dtype=dtype, device=self.device)
        self.drafts = torch.zeros((max_batch, num_drafts), dtype=torch.int64, device=self.device)

    def _forward(self, bucket: int) -> torch.Tensor:
        ctx, assistant = self.inputs.context(bucket), self.model
        ids, hidden = self.inputs.ids[0][:bucket], self.hidden_in[:bucket]
        for step in range(self.num_drafts):
            normed, hidden = assistant(ids, hidden, ctx)
            ids = torch.argmax(assistant.compute_logits(normed), dim=-1)
            self.drafts[:bucket, step].copy_(ids)
        return self.drafts[:bucket]

    def propose(self, seqs: list[Sequence], hidden: torch.Tensor) -> torch.Tensor:
        """-> [len(seqs), num_drafts] draft ids on the device; hidden: the target's states before each newest token."""
        bucket = next(b for b in self.sizes if b >= len(seqs))
        self.inputs.fill(self.builder.build_draft(seqs), bucket)
        self.hidden_in[:len(seqs)].copy_(hidden)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.drafts[:len(seqs)]
        return self._forward(bucket)[:len(seqs)]
