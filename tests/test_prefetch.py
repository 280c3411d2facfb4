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


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _fold(words: torch.Tensor) -> int:
    folded = 0
    for w in words.tolist():
        folded ^= w
    return folded


def _words_folding_to(value: int, count: int) -> torch.Tensor:
    words = torch.randint(-2**31, 2**31 - 1, (count,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    words[-1] = torch.tensor(_fold(words[:-1]) ^ value, dtype=torch.int64).to(torch.int32)
    return words


@pytest.mark.parametrize("count", [BLOCK, 3 * BLOCK + 5])
def test_one_program_reads_every_word(count):
    sink = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _prefetch_kernel[(1,)](_words_folding_to(NEVER, count).to(DEVICE), count, sink, BLOCK=BLOCK)
    assert sink.item() == NEVER


def _share(words: torch.Tensor, program: int, programs: int) -> torch.Tensor:
    """The words program reads: every programs-th BLOCK from its own."""
    return torch.cat(list(words.split(BLOCK))[program::programs])


@pytest.mark.parametrize("folding_program", [None, 0, 1])
def test_programs_stride_over_the_blocks(folding_program):
    """Two programs over 5 blocks: program 0 reads blocks 0, 2, 4, program 1 blocks 1, 3. The words are set so that
    only folding_program's share folds to NEVER (None: only all the words together do); the sink shows which."""
    words = _words_folding_to(NEVER, 5 * BLOCK)
    if folding_program is not None:
        fix = _fold(_share(words, folding_program, 2)) ^ NEVER
        last = words.split(BLOCK)[folding_program]  # a view: its last word moves that program's fold to NEVER
        last[-1] ^= torch.tensor(fix, dtype=torch.int64).to(torch.int32)
    folds = [_fold(_share(words, p, 2)) for p in range(2)]
    assert (NEVER in folds) == (folding_program is not None)
    sink = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _prefetch_kernel[(2,)](words.to(DEVICE), words.numel(), sink, BLOCK=BLOCK)
    assert sink.item() == (0 if folding_program is None else NEVER)


def test_kernel_leaves_the_sink_alone_for_ordinary_words():
    words = torch.arange(3 * BLOCK, dtype=torch.int32, device=DEVICE)
    sink = torch.zeros(1, dtype=torch.int32, device=DEVICE)
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
