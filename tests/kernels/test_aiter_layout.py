"""The data atomlite hands to AITER has AITER's documented layout: checked element by element against index formulas
written from AITER's sources (gemm_a4w4 operand shuffles), independent of the reshape/permute code under test."""
import pytest
import torch

from atomlite.model_ops.aiter import mxfp4
from atomlite.quant import mxfp4 as ref_mxfp4


def weight_destinations(n: int, kb: int) -> torch.Tensor:
    """Flat destination of byte (row, col) of an [N, K/2] weight in the (16, 16) tiling: tiles of 16 rows x 32 bytes,
    inside a tile the two 16-byte halves first, then the 16 rows, then the 16 bytes."""
    row = torch.arange(n)[:, None]
    col = torch.arange(kb)[None, :]
    tile = (row // 16) * (kb // 32) + col // 32
    return ((tile * 2 + (col % 32) // 16) * 16 + row % 16) * 16 + col % 16


def scale_destinations(rows: int, cols: int) -> torch.Tensor:
    """Flat destination of scale (r, c) in gemm_a4w4's e8m0 order: 32-row x 8-column tiles; inside, c%4 outermost,
    then r%16, then (c%8)//4, then (r%32)//16."""
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    tile = (r // 32) * (cols // 8) + c // 8
    return (((tile * 4 + c % 4) * 16 + r % 16) * 2 + (c % 8) // 4) * 2 + (r % 32) // 16


def scatter(src: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(src).view(-1)
    out[dest.reshape(-1)] = src.reshape(-1)
    return out.view(src.shape)


def gather(shuffled: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    return shuffled.reshape(-1)[dest.reshape(-1)].view(dest.shape)


@pytest.mark.parametrize("n,k", [(16, 64), (48, 512), (32, 1024)])
def test_weight_shuffle_matches_tile_formula(n, k):
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    assert torch.equal(mxfp4.shuffle_weight(w), scatter(w, weight_destinations(n, k // 2)))


@pytest.mark.parametrize("rows,cols", [(256, 8), (40, 3), (300, 16)])
def test_scale_shuffle_pads_with_unit_scales_then_matches_formula(rows, cols):
    s = torch.randint(0, 256, (rows, cols), dtype=torch.uint8)
    out = mxfp4.shuffle_scale(s)
    r, c = -(-rows // 256) * 256, -(-cols // 8) * 8
    assert out.shape == (r, c)
    padded = torch.full((r, c), mxfp4.UNIT_SCALE, dtype=torch.uint8)
    padded[:rows, :cols] = s
    assert torch.equal(out, scatter(padded, scale_destinations(r, c)))


def test_weight_shuffle_refuses_unaligned_n():
    with pytest.raises(ValueError, match="N % 16"):
        mxfp4.shuffle_weight(torch.zeros(24, 128, dtype=torch.uint8))


def test_k_padding_keeps_the_product_and_reaches_256():
    n, k = 32, 320
    w_ref = torch.randn(n, k)
    packed, scale = ref_mxfp4.quantize(w_ref)
    padded_w, padded_s = mxfp4.pad_k(packed, scale, mxfp4.K_ALIGN)
    assert padded_w.shape == (n, 512 // 2) and padded_s.shape == (n, 512 // 32)
    x = torch.randn(3, k)
    y_ref = x @ ref_mxfp4.dequantize(packed, scale).T
    y_pad = torch.nn.functional.pad(x, (0, 512 - k)) @ ref_mxfp4.dequantize(padded_w, padded_s).T
    torch.testing.assert_close(y_pad, y_ref)
    assert (padded_s[:, k // 32:] == mxfp4.UNIT_SCALE).all()


def test_prepare_weight_is_shuffled_padded_bytes():
    n, k = 32, 192
    packed, scale = ref_mxfp4.quantize(torch.randn(n, k))
    prepared = mxfp4.prepare_weight(packed, scale)
    assert (prepared.in_features, prepared.padded_in_features) == (192, 256)
    padded_w, padded_s = mxfp4.pad_k(packed, scale, mxfp4.K_ALIGN)
    assert torch.equal(gather(prepared.weight.view(torch.uint8), weight_destinations(n, 128)), padded_w)
    assert torch.equal(gather(prepared.scale.view(torch.uint8), scale_destinations(256, 8))[:n], padded_s)
