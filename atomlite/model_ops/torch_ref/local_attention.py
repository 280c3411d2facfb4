import torch
import torch.nn.functional as F

from atomlite.model_ops.kernels import declare


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_k: torch.Tensor, lengths: torch.Tensor,
                    first_offset: int, softcap: float, invalid_logit: float) -> torch.Tensor:
    """Frame t of sequence b attends to its frames t + first_offset + w, w in [0, W), that lie inside the sequence
    (0 <= s < lengths[b]); the logit of window slot w is q.k + q.rel_k[w], soft-capped, and masked slots get
    invalid_logit. q, k, v: [B, T, H, D] in fp32 (the padded batch); rel_k: [W, H, D]; returns [B, T, H, D]."""
    window = rel_k.shape[0]
    before, after = -first_offset, window - 1 + first_offset
    keys = F.pad(k, (0, 0, 0, 0, before, after)).unfold(1, window, 1)  # [B, T, H, D, W]: key t + first_offset + w
    values = F.pad(v, (0, 0, 0, 0, before, after)).unfold(1, window, 1)
    logits = torch.einsum("bthd,bthdw->bthw", q, keys) + torch.einsum("bthd,whd->bthw", q, rel_k)
    logits = torch.tanh(logits / softcap) * softcap
    frames = torch.arange(q.shape[1], device=q.device)
    slots = frames[:, None] + first_offset + torch.arange(window, device=q.device)  # [T, W]
    inside = (slots >= 0) & (slots < lengths.to(q.device)[:, None, None])  # [B, T, W]
    logits = logits.masked_fill(~inside[:, :, None, :], invalid_logit)
    return torch.einsum("bthw,bthdw->bthd", torch.softmax(logits, dim=-1), values)


declare("local_attention", "torch", local_attention)
