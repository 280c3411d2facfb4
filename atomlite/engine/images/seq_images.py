"""The encoder items of one sequence (images, video frames, audio clips), as the engine sees them: where each one's
soft tokens sit in the prompt, what its tower reads to make them, and the content hash that names them in the
encoder cache and in the prefix-cache keys of the KV blocks they cover. The engine keeps them in `seq.images`."""
from dataclasses import dataclass
from struct import pack

import torch

from atomlite.multimodal.inputs import MultiModalPrompt


@dataclass(slots=True)
class SeqItem:
    """One item's run of soft tokens: prompt positions offset..offset+length-1."""
    offset: int
    length: int
    content_hash: bytes
    modality: str  # "image", "video" or "audio": which of the model's towers encodes it
    tower_inputs: tuple[torch.Tensor, ...]  # what that tower reads (pixels and patch positions; log-mel features)
    bidirectional: bool = False  # its soft tokens see each other both ways where the model's layers allow it

    @property
    def end(self) -> int:
        return self.offset + self.length


def placed_images(prompt: MultiModalPrompt, placeholder_ids: dict[str, int], max_num_batched_tokens: int,
                  max_num_encoder_input_tokens: int, bidirectional: tuple[str, ...] = ()) -> list[SeqItem]:
    """prompt's items checked against its token ids and the step budgets, in prompt order. An item must fit one step
    whole, since its soft tokens are never split across prefill chunks. placeholder_ids: each modality's token;
    bidirectional: the modalities whose soft tokens see each other both ways."""
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
        placeholder = placeholder_ids.get(item.modality)
        if any(t != placeholder for t in ids[offset:offset + length]):
            raise ValueError(f"{where} covers tokens that are not {item.modality} placeholders")
        if length > max_num_batched_tokens:
            raise ValueError(f"items[{i}] has {length} soft tokens, more than --max-num-batched-tokens "
                             f"{max_num_batched_tokens}: an item is prefilled in one step; raise "
                             f"--max-num-batched-tokens (or lower max_soft_tokens)")
        if length > max_num_encoder_input_tokens:
            raise ValueError(f"items[{i}] has {length} soft tokens, more than --max-num-encoder-input-tokens "
                             f"{max_num_encoder_input_tokens}: raise it (or lower max_soft_tokens)")
        images.append(SeqItem(offset, length, item.content_hash, item.modality, item.tower_inputs,
                               item.modality in bidirectional))
        previous_end = offset + length
    return images


def images_in(images: list[SeqItem], start: int, end: int) -> list[SeqItem]:
    """The images with a soft token in positions start..end-1."""
    return [image for image in images if image.offset < end and image.end > start]


def block_image_marks(images: list[SeqItem], start: int, size: int) -> bytes:
    """What a KV block of positions start..start+size-1 holds besides its token ids: each image it overlaps, named
    by content hash and by where the block starts within it (the placeholder ids are the same for every image)."""
    return b"".join(image.content_hash + pack("<q", start - image.offset)
                    for image in images_in(images, start, start + size))


def outside_images(images: list[SeqItem], position: int) -> int:
    """position, or the start of the image it falls inside (a chunk or a cached prefix never ends inside one)."""
    for image in images:
        if image.offset < position < image.end:
            return image.offset
    return position
