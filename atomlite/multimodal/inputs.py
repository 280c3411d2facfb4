"""What the input side hands the engine for a prompt with images, video frames or audio clips: the prompt's token ids
with each item's soft-token run in place, and per item what its tower reads (pixels and patch positions, or log-mel
features) and its content hash."""
from dataclasses import dataclass, field

import numpy as np
import torch

MODALITIES = ("image", "video", "audio")


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

    @property
    def tower_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pixel_values, self.image_position_ids

    def __reduce__(self):
        # as numpy arrays, which pickle protocol 5 hands out of band: the API process sends an item's megabytes to
        # the engine core without copying them into the pickle on its event loop
        return _item_of_arrays, (self.modality, self.pixel_values.numpy(), self.image_position_ids.numpy(),
                                 self.num_soft_tokens, self.content_hash, self.timestamp_s)


def _item_of_arrays(modality: str, pixel_values: np.ndarray, image_position_ids: np.ndarray, num_soft_tokens: int,
                    content_hash: bytes, timestamp_s: float | None) -> ImageItem:
    return ImageItem(modality, _tensor(pixel_values), _tensor(image_position_ids), num_soft_tokens, content_hash,
                     timestamp_s)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """An array read out of band is a read-only view of the message: copied."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


@dataclass(slots=True)
class AudioItem:
    """One audio clip, as the audio tower reads it: input_features [frames, 128] float32, the Gemma 4 feature
    extractor's log-mel frames of the clip (its padding cut off); num_soft_tokens: the tower's output tokens for it;
    content_hash: sha256 of the 16 kHz waveform and the extractor's settings."""
    input_features: torch.Tensor
    num_soft_tokens: int
    content_hash: bytes
    modality: str = "audio"

    @property
    def tower_inputs(self) -> tuple[torch.Tensor]:
        return (self.input_features,)

    def __reduce__(self):  # out of band, as ImageItem's
        return _audio_of_array, (self.input_features.numpy(), self.num_soft_tokens, self.content_hash)


def _audio_of_array(features: np.ndarray, num_soft_tokens: int, content_hash: bytes) -> AudioItem:
    return AudioItem(_tensor(features), num_soft_tokens, content_hash)


@dataclass(slots=True)
class MultiModalPrompt:
    """prompt_token_ids with every item's placeholder run expanded; placeholder_ranges[i] = (offset, length) of
    items[i]'s run of image (video, audio) tokens in prompt_token_ids, found in the ids themselves."""
    prompt_token_ids: list[int]
    items: list["ImageItem | AudioItem"] = field(default_factory=list)
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
