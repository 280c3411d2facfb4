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


def test_expand_tile_across_ragged_fused_slices_and_an_unused_slot():
    """A column tile holding the ends of three fused slices (each column through its own slice's ranks), and a
    slot no row uses (its B is never read: it is all NaN here)."""
    sizes, rank, rows = (40, 24, 20), 8, 11
    g = torch.Generator().manual_seed(12)
    x = torch.randn(rows, 48, generator=g)
    a = torch.randn(4, 3 * rank, 48, generator=g)
    b = torch.randn(4, sum(sizes), rank, generator=g)
    b[2] = float("nan")
    slots = torch.tensor([1, 0, -1, 3, 0, 1, 3, 3, -1, 0, 1], dtype=torch.int32)
    base = torch.randn(rows, sum(sizes), generator=g)
    want = base.double() + per_row(x, a, b, slots, sizes)
    x, a, b, slots, y = (t.to(DEVICE) for t in (x, a, b, slots, base.clone()))
    tri.lora_expand(y, tri.lora_shrink(x, a, slots), b, slots, sizes)
    torch.testing.assert_close(y.double().cpu(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_lora_kernels_compile_for_gfx942_and_gfx950_without_spills():
    """The shrink and expand launches the 31B and 26B-A4B configs make with LoRA on (the full gate:
    tests/kernels/test_compile_gate.py)."""
    from pathlib import Path

    from atomlite.tools.compile_gate import failures, run_gate
    run = run_gate(["gfx942", "gfx950"], launches=f"{Path(__file__).with_name('compile_gate_lora.py')}:launches")
    assert not failures(run), "\n\n".join(failures(run))
    assert {r.kernel for r in run.results} == {"lora.gathered._shrink_kernel", "lora.gathered._expand_kernel"}
    assert all(not (r.stats or {}).get("spills") for r in run.results)
