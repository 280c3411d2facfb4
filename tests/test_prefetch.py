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


@pytest.mark.parametrize("folding_block", [None, 0, 3])
def test_each_program_reads_its_whole_block(folding_block):
    """Four programs over 3 blocks and 5 words. The words are set so that only folding_block's words fold to NEVER
    (None: only all of them together do); the sink shows whether a program saw that."""
    words = _words_folding_to(NEVER, 3 * BLOCK + 5)
    blocks = words.split(BLOCK)  # views
    if folding_block is not None:
        blocks[folding_block][-1] ^= torch.tensor(_fold(blocks[folding_block]) ^ NEVER, dtype=torch.int64).to(
            torch.int32)
    assert [_fold(b) == NEVER for b in blocks] == [i == folding_block for i in range(4)]
    sink = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _prefetch_kernel[(4,)](words.to(DEVICE), words.numel(), sink, BLOCK=BLOCK)
    assert sink.item() == (0 if folding_block is None else NEVER)


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
