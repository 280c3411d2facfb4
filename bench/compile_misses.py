"""Which Triton kernel variants a load still compiles after the engine's startup warm-up: each one is a stall of a
step (seconds on a fresh machine) that the warm-up should have taken.

    PYTHONPATH=. python bench/compile_misses.py --model examples/configs/gemma-4-26B-A4B-it \
        [--num-prompts 256 --input-len 512 --output-len 128 --max-num-seqs 64 --max-model-len 2048]

Random weights (--load-format dummy), bf16. Prints each kernel specialization first launched during the load (a miss
of Triton's in-memory cache: a compile, or a read of the on-disk cache), with the argument types and specializations
that told it apart, and the load's wall time.
"""
import argparse
import time
from collections import Counter

import triton

from atomlite.benchmarks.offline import random_prompts
from atomlite.config import EngineConfig
from atomlite.engine.llm_engine import LLMEngine
from atomlite.sampling_params import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=2048)
    args = p.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, load_format="dummy", dtype="bfloat16",
                                    max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len))
    print(engine.graph_note, engine.warmup_note, sep="\n", flush=True)
    misses = []

    def record(*, repr="?", key=None, **_):  # noqa: A002 - Triton's name
        misses.append((time.perf_counter(), f"{repr} key={key}"))
        return False

    triton.knobs.runtime.jit_cache_hook = record
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(random_prompts(engine, args.num_prompts, args.input_len, seed=0)):
        engine.add_request(f"r{i}", prompt, params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    print(f"load: {args.num_prompts} requests in {time.perf_counter() - start:.1f} s, {steps} steps; "
          f"{len(misses)} kernel variants first launched during it")
    for name, count in Counter(r.split("[", 1)[0] for _, r in misses).most_common():
        print(f"  {count:4d} x {name}")
    for t, r in misses[:40]:
        print(f"  +{t - start:7.2f} s  {r[:1500]}")


if __name__ == "__main__":
    main()
