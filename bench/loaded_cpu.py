"""The engine on a loaded CPU machine (issue 52): LLM.generate of 32 tokens and `atomlite bench throughput` on the
demo model while another process keeps every core busy, with default settings and with OMP_NUM_THREADS=1, for the
tree given (--code: measure a baseline tree the same way). Bounded: a few runs of a few seconds each.

    python bench/loaded_cpu.py [--code /work/main]
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

GENERATE = """
import time
from atomlite import LLM, SamplingParams
from atomlite.demo import demo_model_dir
llm = LLM(str(demo_model_dir()), device="cpu", max_model_len=256)
params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
llm.generate("Hello", params)
times = []
for _ in range(3):
    start = time.perf_counter()
    llm.generate("Hello", params)
    times.append(time.perf_counter() - start)
print("SECONDS", min(times))
"""
SPIN = "while True: pass"


def run(code: Path, one_thread: bool, what: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop("OMP_NUM_THREADS", None)
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"
    if what == "generate":
        out = subprocess.run([sys.executable, "-c", GENERATE], env=env, capture_output=True, text=True, timeout=600)
        return float(re.search(r"SECONDS (\S+)", out.stdout).group(1))
    out = subprocess.run([sys.executable, "-m", "atomlite.cli", "bench", "throughput", "--device", "cpu",
                          "--num-prompts", "16", "--input-len", "64", "--output-len", "32", "--max-model-len", "256"],
                         env=env, capture_output=True, text=True, timeout=600, cwd=code)
    return float(re.search(r"output ([0-9.]+) tok/s", out.stdout).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    try:
        result = {what: {mode: run(args.code.resolve(), mode == "OMP_NUM_THREADS=1", what)
                         for mode in ("default", "OMP_NUM_THREADS=1")}
                  for what in ("generate", "throughput")}
    finally:
        for spinner in spinners:
            spinner.kill()
    result["units"] = {"generate": "s for 32 tokens (best of 3)", "throughput": "output tok/s"}
    result["code"] = str(args.code)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
