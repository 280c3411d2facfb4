"""Runs the compile gate in child processes (Triton's interpreter mode, which the tests set, is fixed at import),
one per platform, `jobs` at a time."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from atomlite.tools.compile_gate.build import KernelResult

MODULE = "atomlite.tools.compile_gate"


def _run_platform(platform: str, models: list[str], launches: str | None) -> list[KernelResult]:
    command = [sys.executable, "-m", MODULE, "--platform", platform]
    command += [arg for model in models for arg in ("--model", str(model))]
    command += ["--launches", launches] if launches else []
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"compile gate for {platform} exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return [KernelResult(**fields) for fields in json.loads(done.stdout)]


def run_gate(platforms: list[str], models: list[str] = (), launches: str | None = None,
             jobs: int = 2) -> list[KernelResult]:
    """Every specialization of every platform, compiled; failures carry the compiler's message."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        per_platform = pool.map(lambda platform: _run_platform(platform, list(models), launches), platforms)
        return [result for results in per_platform for result in results]


def failures(results: list[KernelResult]) -> list[str]:
    return [f"{r.platform}: {r.describe()}:\n{r.error}" for r in results if r.error is not None]
