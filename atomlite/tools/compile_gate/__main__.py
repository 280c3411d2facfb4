"""python -m atomlite.tools.compile_gate --platform gfx950 [--model DIR ...] [--launches file.py:function]:
records what the models launch on the platform (recording.py), compiles every specialization recorded, and prints
both as JSON (runner.py starts this)."""
import argparse
import dataclasses
import importlib
import importlib.util
import json
import sys
from pathlib import Path

from atomlite.model_ops.platform import parse_platform
from atomlite.tools.compile_gate.build import compile_one
from atomlite.tools.compile_gate.recording import record
from atomlite.tools.compile_gate.specialize import gpu_target, unique


def _launches(platform, models: list[str], source: str | None):
    if source is None:
        return record(platform, [Path(model) for model in models] or None)
    module, _, function = source.rpartition(":")
    if module.endswith(".py"):  # a file: Triton reads a kernel's source from its file
        spec = importlib.util.spec_from_file_location(Path(module).stem, module)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    else:
        loaded = importlib.import_module(module)
    return getattr(loaded, function)(platform)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="compile_gate")
    parser.add_argument("--platform", required=True)
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--launches", default=None,
                        help="module:function or file.py:function; function(platform) -> [(workload, launch)]")
    args = parser.parse_args(argv)
    platform = parse_platform(args.platform)
    target = gpu_target(platform)
    specs = unique(_launches(platform, args.model, args.launches), target)
    recorded = [dict(platform=args.platform, key=spec.key, kernel=spec.describe(), workload=spec.workload)
                for spec, _ in specs]
    results = [compile_one(args.platform, spec, options, target) for spec, options in specs]
    json.dump(dict(recorded=recorded, results=[dataclasses.asdict(result) for result in results]), sys.stdout,
              default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
