"""The vision tower's q/k/v norms + 2-D axial RoPE: Triton's one launch against the torch reference (CPU: the
interpreter), and the reference against the rotation written out for one dim pair."""
import pytest
import torch

from atomlite.model_ops.torch_ref import axial_qkv_norm_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, extra_columns: int = 0):
    gen = torch.Generator().manual_seed(tokens + head_dim)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(tokens, width + extra_columns, generator=gen)[:, :width] * 3
    q_weight, k_weight = (torch.rand(head_dim, generator=gen) + 0.5 for _ in range(2))
    positions = torch.randint(0, 40, (tokens, 2), generator=gen)
    inv_freq = 1.0 / 100.0 ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / (head_dim // 2))
    freqs = positions[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    tensors = [qkv, q_weight, k_weight, angles.cos(), angles.sin()]
    return [t.to(dtype).to(DEVICE) for t in tensors]


def test_reference_turns_each_half_by_its_axis():
    """Head dim 8: dims 0..3 turn by x (pairs (0, 2), (1, 3)), dims 4..7 by y; v is normed alone."""
    qkv, qw, kw, cos, sin = inputs(3, 1, 1, 8, torch.float64)
    out = axial_qkv_norm_rope(qkv.cpu(), qw.cpu(), kw.cpu(), 1e-6, cos.cpu(), sin.cpu(), 1, 1)
    q = qkv.cpu()[:, :8]
    q = q / (q.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * qw.cpu()
    c, s = cos.cpu().flatten(1), sin.cpu().flatten(1)
    assert torch.allclose(out[:, 0, 0], q[:, 0] * c[:, 0] - q[:, 2] * s[:, 0])
    assert torch.allclose(out[:, 0, 2], q[:, 2] * c[:, 2] + q[:, 0] * s[:, 2])
    assert torch.allclose(out[:, 0, 5], q[:, 5] * c[:, 5] - q[:, 7] * s[:, 5])
    v = qkv.cpu()[:, 16:]
    assert torch.allclose(out[:, 2], v / (v.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt())


@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(37, 2, 2, 72), (5, 3, 1, 16), (20, 2, 1, 24)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_axial_norm_rope_matches_the_reference(tokens, heads, kv_heads, head_dim, dtype):
    """Rows strided wider than the heads (a view of a wider projection), tokens no multiple of a program's."""
    from atomlite.model_ops.triton.attention.axial_norm_rope import axial_qkv_norm_rope as triton_axial
    qkv, qw, kw, cos, sin = inputs(tokens, heads, kv_heads, head_dim, dtype, extra_columns=8)
    out = triton_axial(qkv, qw, kw, 1e-6, cos, sin, heads, kv_heads)
    upcast = [t.float() for t in (qkv, qw, kw, cos, sin)]
    expected = axial_qkv_norm_rope(upcast[0], upcast[1], upcast[2], 1e-6, upcast[3], upcast[4], heads, kv_heads)
    assert out.shape == (tokens, heads + 2 * kv_heads, head_dim) and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    else:  # the reference gets the same rounded inputs: one rounding of the result (the interpreter truncates)
        err = (out.float() - expected).abs()
        assert (err <= expected.abs() * torch.finfo(dtype).eps * 1.01 + 1e-5).all(), err.max()


@pytest.mark.gpu
def test_triton_axial_norm_rope_at_the_31b_tower_shape():
    """An 896x896 image's 2304 patches, 16 heads x 72, bf16."""
    test_triton_axial_norm_rope_matches_the_reference(2304, 16, 16, 72, torch.bfloat16)
