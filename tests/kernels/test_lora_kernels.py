"""The Triton LoRA shrink and expand equal their torch references, and both equal the plain per-row math: each row
through its own slot, rows without a slot (-1) untouched."""
import pytest
import torch

from atomlite.model_ops.carriers import PartialSums
from atomlite.model_ops.torch_ref import lora as ref
from atomlite.model_ops.triton.lora import gathered as tri

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def per_row(x, a, b, slots, sizes):
    """The math row by row: y_i = B_i (A_i x) for each fused slice i of the row's slot."""
    rank, out = b.shape[2], torch.zeros(x.shape[0], sum(sizes), dtype=torch.float64)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        start = 0
        for i, size in enumerate(sizes):
            shrunk = a[slot, i * rank:(i + 1) * rank].double() @ x[t].double()
            out[t, start:start + size] = b[slot, start:start + size].double() @ shrunk
            start += size
    return out


def summed(shrunk) -> torch.Tensor:
    """A shrink's [T, R'], its K slices added where the kernel split K."""
    return shrunk.parts.sum(0) if isinstance(shrunk, PartialSums) else shrunk


# k=2100: the shrink splits K over programs (PartialSums), the last slice ending mid-step
@pytest.mark.parametrize("sizes,rank,k", [((48,), 8, 40), ((64, 32, 32), 16, 300), ((96, 96), 4, 64),
                                          ((64, 32, 32), 16, 2100)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_expand_match_reference_per_row(dtype, sizes, rank, k):
    g = torch.Generator().manual_seed(len(sizes) * rank + k)
    slots_count, rows = 3, 7
    x = torch.randn(rows, k, generator=g).to(dtype).to(DEVICE)
    a = torch.randn(slots_count, len(sizes) * rank, k, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(slots_count, sum(sizes), rank, generator=g).to(dtype).to(DEVICE)
    slots = torch.tensor([0, -1, 2, 1, 2, -1, 0], dtype=torch.int32, device=DEVICE)
    base = torch.randn(rows, sum(sizes), generator=g).to(dtype).to(DEVICE)
    want = base.double().cpu() + per_row(x.cpu(), a.cpu(), b.cpu(), slots.cpu(), sizes)
    shrunk_ref, shrunk_tri = ref.lora_shrink(x, a, slots), tri.lora_shrink(x, a, slots)
    assert isinstance(shrunk_tri, PartialSums) == (k > 1024)
    torch.testing.assert_close(summed(shrunk_tri), shrunk_ref, rtol=1e-5, atol=1e-4)
    assert shrunk_ref[slots < 0].eq(0).all()
    y_ref, y_tri = base.clone(), base.clone()
    ref.lora_expand(y_ref, shrunk_ref, b, slots, sizes)
    tri.lora_expand(y_tri, shrunk_tri, b, slots, sizes)
    y_mixed = base.clone()  # the torch expand reads the Triton shrink's slices too
    ref.lora_expand(y_mixed, shrunk_tri, b, slots, sizes)
    assert torch.equal(y_tri[slots.cpu() < 0], base[slots.cpu() < 0])
    tolerance = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=2e-2)
    torch.testing.assert_close(y_ref.double().cpu(), want, **tolerance)
    torch.testing.assert_close(y_tri.double().cpu(), want, **tolerance)
    torch.testing.assert_close(y_mixed.double().cpu(), want, **tolerance)


def test_expand_adds_into_fp32_partial_sums_of_a_bf16_projection():
    """A split-K projection hands its slices on unsummed (PartialSums, fp32): the adapter adds into the first."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(2, 8, 32, generator=g).bfloat16()
    b = torch.randn(2, 24, 8, generator=g).bfloat16()
    x, slots = torch.randn(4, 32, generator=g).bfloat16(), torch.tensor([1, 0, -1, 1], dtype=torch.int32)
    part = torch.randn(4, 24, generator=g)
    want = part.double() + per_row(x, a, b, slots, (24,))
    a, b, x, slots, part = (t.to(DEVICE) for t in (a, b, x, slots, part))
    y_ref, y_tri = part.clone(), part.clone()
    ref.lora_expand(y_ref, ref.lora_shrink(x, a, slots), b, slots, (24,))
    tri.lora_expand(y_tri, tri.lora_shrink(x, a, slots), b, slots, (24,))
    torch.testing.assert_close(y_tri, y_ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(y_ref.double().cpu(), want, rtol=1e-5, atol=1e-4)


def test_wide_tile_spans_fused_slices(monkeypatch):
    """Wide projections take wider expand tiles (tuning.EXPAND_WIDE_*); a tile then holds columns of two or three
    fused slices, each through its own ranks. The width threshold is lowered so a small projection takes it."""
    monkeypatch.setattr(tri.tuning, "EXPAND_WIDE_N", 1000)
    sizes, rank = (600, 300, 300), 16
    assert tri.expand_tile(sum(sizes)) == (tri.tuning.EXPAND_WIDE_BLOCK_N, tri.tuning.EXPAND_WIDE_WARPS)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 64, generator=g)
    a = torch.randn(2, 3 * rank, 64, generator=g)
    b = torch.randn(2, sum(sizes), rank, generator=g)
    slots = torch.tensor([1, 0, -1, 1, 0], dtype=torch.int32)
    base = torch.randn(5, sum(sizes), generator=g)
    want = base.double() + per_row(x, a, b, slots, sizes)
    x, a, b, slots, y = (t.to(DEVICE) for t in (x, a, b, slots, base.clone()))
    tri.lora_expand(y, tri.lora_shrink(x, a, slots), b, slots, sizes)
    torch.testing.assert_close(y.double().cpu(), want, rtol=1e-5, atol=1e-4)
