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


# Triton's kernel against the reference: CPU runs it in the interpreter (conftest), a GPU compiled.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def packed_inputs(lengths: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                  device: str = DEVICE, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, heads, head_dim, generator=gen)
    k, v = (torch.randn(total, kv_heads, head_dim, generator=gen) for _ in range(2))
    return [t.to(dtype).to(device) for t in (q, k, v)], PackedSequences.of(lengths, device)


def assert_matches_reference(out, q, k, v, packed, scale):
    expected = encoder_attention(q.float(), k.float(), v.float(), packed, scale)
    assert out.shape == q.shape and out.dtype == q.dtype and not out.isnan().any()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    else:
        # the reference gets the same rounded inputs: one rounding of the result to the 16-bit dtype (the interpreter
        # truncates on store); on a GPU also the probabilities' rounding before P.V, an error of up to eps of each
        # term p|v|, which cancellation can leave large beside a small result: bounded by eps * P.|V|
        err, eps = (out.float() - expected).abs(), torch.finfo(out.dtype).eps
        if DEVICE == "cpu":
            bound = expected.abs() * eps * 1.01 + 1e-5
        else:
            terms = encoder_attention(q.float(), k.float(), v.float().abs(), packed, scale)
            bound = eps * (expected.abs() + 2 * terms) + 1e-5
        assert (err <= bound).all(), (err - bound).max()


# Lengths: one patch; tails that are no multiple of the key tile (32 interpreted) or of the query rows; a sequence
# longer than one query tile beside short ones.
@pytest.mark.parametrize("lengths", [[1], [1, 33, 7], [70, 5], [31, 1, 64]])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(72, 4, 4), (64, 3, 3), (72, 4, 2), (64, 6, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_encoder_attention_matches_the_reference(lengths, head_dim, heads, kv_heads, dtype):
    from atomlite.model_ops.triton.attention.encoder import encoder_attention as triton_encoder_attention
    (q, k, v), packed = packed_inputs(lengths, heads, kv_heads, head_dim, dtype, seed=sum(lengths) + head_dim)
    scale = head_dim ** -0.5
    assert_matches_reference(triton_encoder_attention(q, k, v, packed, scale), q, k, v, packed, scale)


def test_triton_encoder_attention_reads_strided_heads_and_an_empty_pack():
    """q/k/v as views of one fused projection's output (rows strided by all three), and no rows at all."""
    from atomlite.model_ops.triton.attention.encoder import encoder_attention as triton_encoder_attention
    lengths, heads, head_dim = [5, 40], 2, 72
    gen = torch.Generator().manual_seed(7)
    fused = torch.randn(sum(lengths), 3 * heads, head_dim, generator=gen).to(DEVICE)
    q, k, v = fused.split(heads, dim=1)
    packed = PackedSequences.of(lengths, DEVICE)
    assert_matches_reference(triton_encoder_attention(q, k, v, packed, 0.1), q, k, v, packed, 0.1)
    empty = torch.empty(0, heads, head_dim, device=DEVICE)
    assert triton_encoder_attention(empty, empty, empty, PackedSequences.of([], DEVICE), 0.1).shape == empty.shape


@pytest.mark.gpu
@pytest.mark.parametrize("heads,head_dim,dtype", [(16, 72, torch.float32), (12, 64, torch.float32),
                                                  (16, 72, torch.bfloat16)])
def test_triton_encoder_attention_at_the_largest_images_holds_no_score_matrix(heads, head_dim, dtype):
    """Compiled, at the towers' shapes (31B / 26B-A4B: 16 x 72; E2B / E4B: 12 x 64) on an image of 2520 patches
    beside one of 10080 (max_soft_tokens 1120): equal to the reference, and the call allocates its output alone
    (the largest image's [heads, T, T] fp32 scores would be 6.5 GB)."""
    from atomlite.model_ops.triton.attention.encoder import encoder_attention as triton_encoder_attention
    (q, k, v), packed = packed_inputs([2520, 10080], heads, heads, head_dim, dtype, seed=1)
    scale = head_dim ** -0.5
    triton_encoder_attention(q, k, v, packed, scale)  # compiles
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = triton_encoder_attention(q, k, v, packed, scale)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= 2 * out.numel() * out.element_size()
    assert_matches_reference(out, q, k, v, packed, scale)
