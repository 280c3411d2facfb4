"""tests/interpreter_calls.py (installed by conftest.py under TRITON_INTERPRET=1): a launch patches triton.language
once however many helpers its kernel calls, the kernel computes what it did, and the launch leaves triton.language
as it found it."""
import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's behaviour")


@triton.jit
def _plus_one(x):
    return x + 1.0


@triton.jit
def _add_in_helpers(x_ptr, out_ptr, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols)
    for _ in tl.static_range(CALLS):
        x = _plus_one(x)
    tl.store(out_ptr + cols, x)


def _patches_of_a_launch(calls: int, monkeypatch) -> tuple[int, torch.Tensor]:
    from triton.runtime import interpreter
    count, real = [], interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *args: (count.append(1), real(*args))[1])
    x, out = torch.arange(16, dtype=torch.float32), torch.empty(16)
    _add_in_helpers[(1,)](x, out, CALLS=calls, BLOCK=16)
    monkeypatch.undo()
    return len(count), out - x


def test_a_launch_patches_triton_language_once_however_many_helpers_it_calls(monkeypatch):
    unpatched_load = tl.load
    alone, none_added = _patches_of_a_launch(0, monkeypatch)
    with_helpers, added = _patches_of_a_launch(8, monkeypatch)
    assert alone > 0 and with_helpers == alone
    assert torch.equal(none_added, torch.zeros(16)) and torch.equal(added, torch.full((16,), 8.0))
    assert tl.load is unpatched_load
