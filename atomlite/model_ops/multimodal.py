"""Soft tokens (an image's or a video frame's, already in the text model's width) that take the place of some of a
forward step's token rows."""
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class MultiModalEmbeds:
    """values[i] replaces the embedding of the step's token row positions[i]."""
    positions: torch.Tensor  # [n] int64, row indices into this step's token ids
    values: torch.Tensor  # [n, hidden]

    def __post_init__(self):
        if self.positions.dim() != 1 or self.values.dim() != 2 or len(self.positions) != len(self.values):
            raise ValueError(f"MultiModalEmbeds needs positions [n] and values [n, hidden]; got "
                             f"{tuple(self.positions.shape)} and {tuple(self.values.shape)}")

    def with_pad_ids(self, ids: torch.Tensor, pad_id: int) -> torch.Tensor:
        """ids with pad_id at the soft tokens' rows (what a text-side lookup reads there)."""
        return ids.index_fill(0, self.positions, pad_id)

    def placed_in(self, embeds: torch.Tensor) -> torch.Tensor:
        """embeds with the soft tokens at their rows (as they are: no embedding scale)."""
        return embeds.index_copy(0, self.positions, self.values.to(embeds.dtype))
