"""The vision tower's outputs kept for reuse, keyed by the item's content hash and bounded in bytes: the same image
in another request, or a preempted request's image when it is recomputed, is not encoded again.

vLLM keeps encoder outputs in its EncoderCacheManager, sized in soft tokens (encoder_cache_size, which defaults to
max_num_batched_tokens raised to the largest item). atomlite bounds the bytes instead (--encoder-cache-memory; the
default is vLLM's size in tokens at the model's width and dtype), so the bound is what the memory profile sets aside.
Entries are never pinned: a step holds the tensors it uses, so evicting one only ends its reuse."""
from collections import OrderedDict

import torch

from atomlite.multimodal.patches import SUPPORTED_SOFT_TOKENS

MAX_SOFT_TOKENS = max(SUPPORTED_SOFT_TOKENS)  # one image's most soft tokens (max_soft_tokens 1120)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def encoder_cache_bytes(config) -> int:
    """--encoder-cache-memory, else vLLM's encoder cache size (the larger of the per-step encoder budget and the
    largest image) in soft tokens of the model's width and dtype."""
    if config.encoder_cache_memory is not None:
        return config.encoder_cache_memory
    tokens = max(config.max_num_encoder_input_tokens, MAX_SOFT_TOKENS)
    return tokens * config.model_spec.hf["hidden_size"] * config.torch_dtype.itemsize


class EncoderCache:
    """Least recently used soft tokens, at most capacity_bytes of them."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __contains__(self, content_hash: bytes) -> bool:
        return content_hash in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, content_hash: bytes) -> torch.Tensor | None:
        soft_tokens = self._entries.get(content_hash)
        if soft_tokens is not None:
            self._entries.move_to_end(content_hash)
        return soft_tokens

    def put(self, content_hash: bytes, soft_tokens: torch.Tensor) -> None:
        """Keeps soft_tokens, evicting the least recently used entries for room; one larger than the whole cache is
        not kept."""
        size = tensor_bytes(soft_tokens)
        if content_hash in self._entries or size > self.capacity_bytes:
            return
        while self.num_bytes + size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= tensor_bytes(evicted)
        self._entries[content_hash] = soft_tokens
        self.num_bytes += size
