import torch
import torch.nn.functional as F

from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.kernels import declare


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedSequences,
                      scale: float) -> torch.Tensor:
    """Bidirectional attention within each packed sequence, none across them. q: [T, H, D]; k, v: [T, KV heads, D]
    (query heads grouped over KV heads); returns [T, H, D]. SDPA per sequence, its lengths read from the host."""
    out = torch.empty_like(q)
    grouped = q.shape[1] != k.shape[1]
    for rows in packed.row_ranges():
        heads_first = [t[rows].transpose(0, 1) for t in (q, k, v)]
        attended = F.scaled_dot_product_attention(*heads_first, scale=scale, enable_gqa=grouped)
        out[rows] = attended.transpose(0, 1)
    return out


declare("encoder_attention", "torch", encoder_attention)
