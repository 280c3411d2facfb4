"""Runs the compile gate in child processes (Triton's interpreter mode, which the tests set, is fixed at import),
one per platform, `jobs` at a time; each records what the models launch and compiles it."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from atomlite.tools.compile_gate.build import KernelResult

MODULE = "atomlite.tools.compile_gate"


@dataclass
class GateRun:
    """What the models launch (recorded: platform, key, kernel, workload of each specialization) and what the gate
    compiled of it."""
    recorded: list[dict]
    results: list[KernelResult]


def _run_platform(platform: str, models: list[str], launches: str | None) -> GateRun:
    command = [sys.executable, "-m", MODULE, "--platform", platform]
    command += [arg for model in models for arg in ("--model", str(model))]
    command += ["--launches", launches] if launches else []
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"compile gate for {platform} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    out = json.loads(done.stdout)
    return GateRun(out["recorded"], [KernelResult(**fields) for fields in out["results"]])


def run_gate(platforms: list[str], models: list[str] = (), launches: str | None = None, jobs: int = 2) -> GateRun:
    """Every specialization the models launch on each platform, compiled; failures carry the compiler's message."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda platform: _run_platform(platform, list(models), launches), platforms))
    return GateRun([r for run in runs for r in run.recorded], [r for run in runs for r in run.results])


def uncompiled(run: GateRun) -> list[str]:
    """The recorded specializations the gate did not compile."""
    compiled = {(r.platform, r.key) for r in run.results}
    return [f"{r['platform']}: {r['kernel']} ({r['workload']}): launched by the model, not compiled"
            for r in run.recorded if (r["platform"], r["key"]) not in compiled]


def failures(run: GateRun) -> list[str]:
    """Specializations that failed to compile, then those recorded and not compiled."""
    broken = [f"{r.platform}: {r.describe()}:\n{r.error}" for r in run.results if r.error is not None]
    return broken + uncompiled(run)
