"""python -m atomlite.model_ops.triton.compile_gate --platform gfx950 [--model DIR ...] [--launches module:function]:
compiles every specialization for the platform and prints the results as JSON (runner.py starts this)."""
import argparse
import dataclasses
import importlib
import json
import sys

from atomlite.model_ops.aiter.plan import parse_platform
from atomlite.model_ops.triton.compile_gate.build import compile_one
from atomlite.model_ops.triton.compile_gate.specialize import gpu_target, unique
from atomlite.model_ops.triton.compile_gate.workloads import gemma4_launches


def _launches(platform, models: list[str], source: str | None):
    if source is None:
        return gemma4_launches(platform, models or None)
    module, _, function = source.partition(":")
    return getattr(importlib.import_module(module), function)(platform)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="compile_gate")
    parser.add_argument("--platform", required=True)
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--launches", default=None, help="module:function(platform) -> [(workload, launch)]")
    args = parser.parse_args(argv)
    platform = parse_platform(args.platform)
    target = gpu_target(platform)
    specs = unique(_launches(platform, args.model, args.launches), target)
    results = [compile_one(args.platform, spec, options, target) for spec, options in specs]
    json.dump([dataclasses.asdict(result) for result in results], sys.stdout, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
