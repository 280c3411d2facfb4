"""Compile gate: every Triton kernel specialization atomlite's models launch on a platform, compiled for that
platform's GPU without one (Triton's AMD and NVIDIA backends run on a CPU machine), with its registers, spills, shared
memory and occupancy.

recording.py builds each config of examples/configs on the meta device as the engine builds it and runs its forward
at the engine's default steps, recording the launches the launchers make (common.recording); specialize.py turns
each into what Triton compiles for the target; build.py compiles it and stats.py reads the figures; runner.py runs
all that in child processes and reports a recorded specialization the gate did not compile, and report.py prints the
table (`atomlite plan --kernels --platform gfx950 --compile`).
"""
from atomlite.tools.compile_gate.build import KernelResult
from atomlite.tools.compile_gate.runner import GateRun, failures, run_gate, uncompiled

__all__ = ["GateRun", "KernelResult", "failures", "run_gate", "uncompiled"]
