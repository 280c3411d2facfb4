"""A step's soft tokens: for each encoder item (image, video frame, audio clip) whose placeholders the step's chunk
covers, its soft tokens from the encoder cache, or from the model's towers (the step's uncached items in one
embed_items call), placed at the step's token rows (MultiModalEmbeds). Rank 0 alone encodes; under tensor
parallelism the other ranks receive the rows (model_runner)."""
import math
from dataclasses import dataclass

import numpy as np
import torch

from atomlite.engine.images.encoder_cache import MAX_SOFT_TOKENS, EncoderCache
from atomlite.multimodal.audio import MAX_SOFT_TOKENS as MAX_AUDIO_SOFT_TOKENS, dummy_features
from atomlite.engine.sequence import Sequence
from atomlite.engine.images.seq_images import SeqItem, images_in


@dataclass
class SoftTokenRows:
    """Which rows of a step are soft tokens, and their values' width and dtype: what a rank that does not encode
    needs to receive them."""
    positions: np.ndarray  # [n] int64, row indices into the step's tokens
    width: int
    dtype: torch.dtype


@dataclass
class _Placement:
    row: int  # the step row of the first soft token placed
    image: SeqItem
    first: int  # the image's soft tokens first..last-1 go there
    last: int


def placements(batch: list[tuple[Sequence, int]]) -> list[_Placement]:
    """Where the step's chunks cover soft tokens, in row order."""
    placed, row = [], 0
    for seq, num_new in batch:
        if seq.images:
            start = seq.num_computed_tokens
            for image in images_in(seq.images, start, start + num_new):
                first, last = max(image.offset, start), min(image.end, start + num_new)
                placed.append(_Placement(row + first - start, image, first - image.offset, last - image.offset))
        row += num_new
    return placed


class ImageEmbedder:
    def __init__(self, model, cache: EncoderCache, device: torch.device):
        self.model, self.cache, self.device = model, cache, device
        self.num_encoded = 0  # items the tower encoded (a cache hit is not one)

    def step_soft_tokens(self, batch: list[tuple[Sequence, int]]) -> tuple[np.ndarray, torch.Tensor] | None:
        """(the step's rows that are soft tokens [n] int64, their values [n, width]); None when its chunks cover
        no soft token."""
        placed = placements(batch)
        if not placed:
            return None
        soft_tokens = self._soft_tokens([p.image for p in placed])
        rows = np.concatenate([np.arange(p.row, p.row + p.last - p.first) for p in placed])
        return rows, torch.cat([soft_tokens[p.image.content_hash][p.first:p.last] for p in placed])

    def _soft_tokens(self, images: list[SeqItem]) -> dict[bytes, torch.Tensor]:
        found, missing = {}, {}
        for image in images:
            key = image.content_hash
            if key not in found and key not in missing:
                cached = self.cache.get(key)
                if cached is not None:
                    found[key] = cached
                else:
                    missing[key] = image
        if missing:
            encoded = self.model.embed_items([i.modality for i in missing.values()],
                                             [i.tower_inputs for i in missing.values()])
            self.num_encoded += len(missing)
            for key, soft_tokens in zip(missing, encoded):
                found[key] = soft_tokens.clone()  # its own storage: the cache counts its bytes alone
                self.cache.put(key, found[key])
        return found


def dummy_images(num_soft_tokens: int, patch_size: int, pool: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixels and position ids of an image the processor could give with num_soft_tokens soft tokens: a grid of
    pool x pool squares, as square as the count allows."""
    columns = next(w for w in range(math.isqrt(num_soft_tokens), 0, -1) if num_soft_tokens % w == 0)
    width, height = columns * pool, num_soft_tokens // columns * pool
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], dim=1)
    pixels = torch.rand(len(positions), 3 * patch_size ** 2, generator=torch.Generator().manual_seed(0))
    return pixels, positions


def longest_clip(max_num_batched_tokens: int, max_num_encoder_input_tokens: int) -> int:
    """The most soft tokens of a clip the audio tower may encode: a 30 s clip's (750), or what the limits allow."""
    return min(MAX_AUDIO_SOFT_TOKENS, max_num_batched_tokens, max_num_encoder_input_tokens)


def largest_step_audio(max_num_batched_tokens: int, max_num_encoder_input_tokens: int) -> list[torch.Tensor]:
    """The log-mel features of the most the audio tower may encode in one step: the longest clips, as many as the
    encoder budget takes."""
    largest = longest_clip(max_num_batched_tokens, max_num_encoder_input_tokens)
    return [dummy_features(largest)] * max(1, max_num_encoder_input_tokens // largest)


def largest_step_images(vision_hf: dict, max_num_batched_tokens: int, max_num_encoder_input_tokens: int) \
        -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The pixels and position ids of the most the tower may encode in one step: images of the most soft tokens
    the limits allow (MAX_SOFT_TOKENS: 10080 patches), as many as the encoder budget takes."""
    largest = min(MAX_SOFT_TOKENS, max_num_batched_tokens, max_num_encoder_input_tokens)
    count = max(1, max_num_encoder_input_tokens // largest)
    pixels, positions = dummy_images(largest, vision_hf.get("patch_size", 16), vision_hf.get("pooling_kernel_size", 3))
    return [pixels] * count, [positions] * count
