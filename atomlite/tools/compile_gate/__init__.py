"""Compile gate: every Triton kernel specialization atomlite would launch on a platform, compiled for that platform's
GPU without one (Triton's AMD and NVIDIA backends run on a CPU machine), with its registers, spills, shared memory
and occupancy.

workloads.py calls the ops the dispatch table gives to Triton for the Gemma 4 configs on meta tensors and records
the launches the launchers make (common.recording); specialize.py turns each into what Triton compiles for the
target; build.py compiles it and stats.py reads the figures; runner.py runs all that in child processes, and
report.py prints the table (`atomlite plan --kernels --platform gfx950 --compile`).
"""
from atomlite.tools.compile_gate.build import KernelResult
from atomlite.tools.compile_gate.runner import failures, run_gate

__all__ = ["KernelResult", "failures", "run_gate"]
