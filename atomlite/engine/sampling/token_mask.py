"""Token masks as xgrammar packs them (int32 words, bit j of word w for token 32w + j), applied to logits with
torch ops on any device."""
import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, ceil(vocab_size / 32)] int32 -> [N, vocab_size] bool: bit j of word w says whether token 32w + j is
    allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # & 1 drops the sign bits the arithmetic shift copies in
    return bits.flatten(1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of logits [N, V] with each row's disallowed tokens at -inf."""
    return logits.masked_fill(~unpack_bitmask(bitmask, logits.shape[-1]), float("-inf"))
