"""The L2 prefetch kernel reads every word of a weight and changes nothing: under the interpreter on CPU (the sink
is written only when the words fold to the one value no weight is expected to give), on a GPU, and compiled for
gfx942 and gfx950 (the ROCm dispatch does not launch it yet: measured on H100 only)."""
from pathlib import Path

import pytest
import torch

from atomlite.model_ops import dispatch
from atomlite.model_ops.platform import parse_platform
from atomlite.model_ops.triton.common import KernelLaunch
from atomlite.model_ops.triton.compile_gate import failures, run_gate
from atomlite.model_ops.triton.prefetch import BLOCK, NEVER, _prefetch_kernel, l2_prefetch


def _words_folding_to(value: int, count: int) -> torch.Tensor:
    words = torch.randint(-2**31, 2**31 - 1, (count,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    rest = 0
    for w in words[:-1].tolist():
        rest ^= w
    words[-1] = torch.tensor(rest ^ value, dtype=torch.int64).to(torch.int32)
    return words


@pytest.mark.parametrize("count", [BLOCK, 3 * BLOCK + 5])
def test_kernel_reads_every_word(count):
    words, sink = _words_folding_to(NEVER, count), torch.zeros(1, dtype=torch.int32)
    programs = -(-count // BLOCK)
    _prefetch_kernel[(programs,)](words, count, sink, BLOCK=BLOCK)
    # each program folds its own words: only a program whose words fold to NEVER writes the sink
    folds = [0] * programs
    for i, w in enumerate(words.tolist()):
        folds[i // BLOCK] ^= w
    assert (sink.item() == NEVER) == (NEVER in [f if f < 2**31 else f - 2**32 for f in folds])


def test_kernel_leaves_the_sink_alone_for_ordinary_words():
    words = torch.arange(2 * BLOCK, dtype=torch.int32)
    sink = torch.zeros(1, dtype=torch.int32)
    _prefetch_kernel[(2,)](words, words.numel(), sink, BLOCK=BLOCK)
    assert sink.item() == 0


def test_rocm_and_cpu_dispatch_leave_the_prefetch_to_the_no_op_reference():
    for platform in ("gfx942", "gfx950+aiter", "cpu"):
        assert dispatch.choose("l2_prefetch", parse_platform(platform)).backend == "torch"
    assert dispatch.choose("l2_prefetch", parse_platform("sm_90")).backend == "triton"


def gate_launches(platform) -> list[tuple[str, KernelLaunch]]:
    words = torch.empty(1 << 20, dtype=torch.int32, device="meta")
    sink = torch.empty(1, dtype=torch.int32, device="meta")
    launch = KernelLaunch(_prefetch_kernel, (128,), (words, words.numel(), sink), {"BLOCK": BLOCK, "num_warps": 4})
    return [("L2 prefetch of a weight", launch)]


def test_kernel_compiles_for_gfx942_and_gfx950():
    results = run_gate(["gfx942", "gfx950"], launches=f"{Path(__file__)}:gate_launches")
    assert not failures(results) and {r.platform for r in results} == {"gfx942", "gfx950"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/HIP GPU")
def test_prefetch_on_the_gpu_changes_nothing():
    weight = torch.randn(2816, 4096, device="cuda", dtype=torch.bfloat16)
    before = weight.clone()
    l2_prefetch(weight, 1)
    torch.cuda.synchronize()
    assert torch.equal(weight, before)
