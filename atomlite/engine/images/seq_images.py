"""The images (and video frames) of one sequence, as the engine sees them: where each one's soft tokens sit in the
prompt, what the vision tower reads to make them, and the content hash that names them in the encoder cache and in
the prefix-cache keys of the KV blocks they cover."""
from dataclasses import dataclass
from struct import pack

import torch

from atomlite.multimodal.inputs import MultiModalPrompt


@dataclass(slots=True)
class SeqImage:
    """One item's run of soft tokens: prompt positions offset..offset+length-1."""
    offset: int
    length: int
    content_hash: bytes
    pixel_values: torch.Tensor  # [max_patches, 3 * patch^2]
    position_ids: torch.Tensor  # [max_patches, 2], (-1, -1) on padding rows

    @property
    def end(self) -> int:
        return self.offset + self.length


def placed_images(prompt: MultiModalPrompt, placeholder_ids: set[int], max_num_batched_tokens: int,
                  max_num_encoder_input_tokens: int) -> list[SeqImage]:
    """prompt's items checked against its token ids and the step budgets, in prompt order. An item must fit one step
    whole, since its soft tokens are never split across prefill chunks."""
    ids, items, ranges = prompt.prompt_token_ids, prompt.items, prompt.placeholder_ranges
    if len(items) != len(ranges):
        raise ValueError(f"multimodal prompt: {len(items)} items but {len(ranges)} placeholder_ranges")
    images, previous_end = [], 0
    for i, (item, (offset, length)) in enumerate(zip(items, ranges)):
        where = f"placeholder_ranges[{i}]"
        if offset < previous_end or offset + length > len(ids) or length < 1:
            raise ValueError(f"{where} ({offset}, {length}) lies outside the prompt's {len(ids)} tokens or overlaps "
                             f"the item before it")
        if length != item.num_soft_tokens:
            raise ValueError(f"{where} has {length} tokens; items[{i}] has {item.num_soft_tokens} soft tokens")
        if any(t not in placeholder_ids for t in ids[offset:offset + length]):
            raise ValueError(f"{where} covers tokens that are not image or video placeholders")
        if length > max_num_batched_tokens:
            raise ValueError(f"items[{i}] has {length} soft tokens, more than --max-num-batched-tokens "
                             f"{max_num_batched_tokens}: an image is prefilled in one step; raise "
                             f"--max-num-batched-tokens or lower max_soft_tokens")
        if length > max_num_encoder_input_tokens:
            raise ValueError(f"items[{i}] has {length} soft tokens, more than --max-num-encoder-input-tokens "
                             f"{max_num_encoder_input_tokens}: raise it or lower max_soft_tokens")
        images.append(SeqImage(offset, length, item.content_hash, item.pixel_values, item.image_position_ids))
        previous_end = offset + length
    return images


def images_in(images: list[SeqImage], start: int, end: int) -> list[SeqImage]:
    """The images with a soft token in positions start..end-1."""
    return [image for image in images if image.offset < end and image.end > start]


def block_image_marks(images: list[SeqImage], start: int, size: int) -> bytes:
    """What a KV block of positions start..start+size-1 holds besides its token ids: each image it overlaps, named
    by content hash and by where the block starts within it (the placeholder ids are the same for every image)."""
    return b"".join(image.content_hash + pack("<q", start - image.offset)
                    for image in images_in(images, start, start + size))


def outside_images(images: list[SeqImage], position: int) -> int:
    """position, or the start of the image it falls inside (a chunk or a cached prefix never ends inside one)."""
    for image in images:
        if image.offset < position < image.end:
            return image.offset
    return position
