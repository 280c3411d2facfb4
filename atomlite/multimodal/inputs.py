"""What the input side hands the engine for a prompt with images or video frames: the prompt's token ids with
each item's soft-token run in place, and per item its pixels, patch positions and content hash."""
from dataclasses import dataclass, field

import numpy as np
import torch

MODALITIES = ("image", "video")


@dataclass(slots=True)
class ImageItem:
    """One image, or one video frame, as the vision tower reads it.

    pixel_values: [max_patches, patch_size**2 * 3] float32 in [0, 1], rows past the image's patches zero;
    image_position_ids: [max_patches, 2] int64 (x, y) of each patch, (-1, -1) on the padding rows (the layout
    transformers' Gemma4ImageProcessor gives one image); num_soft_tokens: the vision tower's output tokens for it;
    content_hash: sha256 of the decoded pixels and the settings that change pixel_values (an encoder-cache key);
    timestamp_s: a video frame's time in its video."""
    modality: str
    pixel_values: torch.Tensor
    image_position_ids: torch.Tensor
    num_soft_tokens: int
    content_hash: bytes
    timestamp_s: float | None = None

    def __reduce__(self):
        # as numpy arrays, which pickle protocol 5 hands out of band: the API process sends an item's megabytes to
        # the engine core without copying them into the pickle on its event loop
        return _item_of_arrays, (self.modality, self.pixel_values.numpy(), self.image_position_ids.numpy(),
                                 self.num_soft_tokens, self.content_hash, self.timestamp_s)


def _item_of_arrays(modality: str, pixel_values: np.ndarray, image_position_ids: np.ndarray, num_soft_tokens: int,
                    content_hash: bytes, timestamp_s: float | None) -> ImageItem:
    """An unpickled ImageItem; arrays read out of band are read-only views of the message: copied."""
    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array if array.flags.writeable else array.copy())
    return ImageItem(modality, tensor(pixel_values), tensor(image_position_ids), num_soft_tokens, content_hash,
                     timestamp_s)


@dataclass(slots=True)
class MultiModalPrompt:
    """prompt_token_ids with every item's placeholder run expanded; placeholder_ranges[i] = (offset, length) of
    items[i]'s run of image (or video) tokens in prompt_token_ids, found in the ids themselves."""
    prompt_token_ids: list[int]
    items: list[ImageItem] = field(default_factory=list)
    placeholder_ranges: list[tuple[int, int]] = field(default_factory=list)


def placeholder_runs(token_ids: list[int], placeholder_ids: set[int]) -> list[tuple[int, int]]:
    """(offset, length) of each maximal run of one placeholder id, in order."""
    runs, start = [], None
    for i, token in enumerate(token_ids):
        if start is not None and token != token_ids[start]:
            runs.append((start, i - start))
            start = None
        if start is None and token in placeholder_ids:
            start = i
    if start is not None:
        runs.append((start, len(token_ids) - start))
    return runs
