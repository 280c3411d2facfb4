"""Compiles specializations for a target, in this process: Triton must not be in interpreter mode here (it fixes
the mode at import), which is why runner.py starts this module without TRITON_INTERPRET."""
import contextlib
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget

from atomlite.model_ops.triton.common import interpreting
from atomlite.tools.compile_gate.specialize import Specialization
from atomlite.tools.compile_gate.stats import kernel_stats


@dataclass
class KernelResult:
    platform: str
    kernel: str
    constexprs: dict
    options: dict
    workload: str
    stats: dict | None  # KernelStats.as_dict(), None when the compile failed
    error: str | None  # the compiler's message
    seconds: float
    key: str = ""  # the specialization's (Specialization.key)

    def describe(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        tuning = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.kernel}[{values}; {tuning}] ({self.workload})"


def _last_lines(error: BaseException, count: int = 12) -> str:
    lines = "".join(traceback.format_exception_only(error)).strip().splitlines()
    return "\n".join(lines[-count:])


@contextlib.contextmanager
def _native_stderr():
    """Collects what native code writes to file descriptor 2: LLVM's assembler reports there (e.g. 'invalid
    instruction'), while the exception only says that linking failed."""
    with tempfile.TemporaryFile(mode="w+") as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield sink
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def compile_one(platform: str, spec: Specialization, options: dict, target: GPUTarget) -> KernelResult:
    if interpreting():
        raise RuntimeError("the compile gate needs Triton outside interpreter mode: unset TRITON_INTERPRET")
    start = time.perf_counter()
    stats, error = None, None
    with _native_stderr() as native:
        try:
            stats = kernel_stats(triton.compile(spec.source, target=target, options=options)).as_dict()
        except Exception as e:  # noqa: BLE001 - any compiler failure is the gate's finding, reported by kernel
            native.seek(0)
            error = "\n".join(filter(None, [native.read().strip()[-2000:], _last_lines(e)]))
    return KernelResult(platform, spec.kernel, spec.constexprs, spec.options, spec.workload, stats, error,
                        time.perf_counter() - start, spec.key)
