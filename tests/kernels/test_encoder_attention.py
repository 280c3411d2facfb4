"""The reference encoder attention itself (the oracle of any kernel for it): packed sequences against float64
softmax attention over all rows with a block-diagonal mask, so no row sees another sequence's."""
import pytest
import torch

from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.torch_ref import encoder_attention


def block_diagonal_reference(q, k, v, lengths: list[int], scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    scores = scores.masked_fill(sequence[:, None] != sequence[None, :], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vv)


@pytest.mark.parametrize("head_dim", [72, 64])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("lengths", [[9], [9, 36, 18], [1, 27]])
def test_packed_sequences_attend_only_within_themselves(head_dim, heads, kv_heads, lengths):
    gen = torch.Generator().manual_seed(sum(lengths) + head_dim)
    total = sum(lengths)
    q = torch.randn(total, heads, head_dim, generator=gen)
    k, v = (torch.randn(total, kv_heads, head_dim, generator=gen) for _ in range(2))
    out = encoder_attention(q, k, v, PackedSequences.of(lengths, "cpu"), scale=0.3)
    expected = block_diagonal_reference(q, k, v, lengths, 0.3)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_packed_sequences_know_their_boundaries_on_both_sides():
    packed = PackedSequences.of([9, 36, 18], "cpu")
    assert packed.cu_seqlens.tolist() == [0, 9, 45, 63] and packed.cu_seqlens.dtype == torch.int32
    assert packed.max_length == 36
    assert packed.row_ranges() == [slice(0, 9), slice(9, 45), slice(45, 63)]
