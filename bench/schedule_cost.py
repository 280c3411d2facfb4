"""Host time of Scheduler.schedule() per decode step: 256 sequences decoding, with and without a 32k-token prompt
waiting that the KV pool has no room for. The waiting prompt must not make each step cost more (its prefix keys are
computed once, and a refused head is not tried again until room can have changed).

    PYTHONPATH=. python bench/schedule_cost.py [--model examples/configs/gemma-4-31B-it --running 256 --steps 300]

The model's real KV specs (config.json on the meta device) and a pool (its memory on the meta device: nothing is
allocated) that holds the running sequences at their max_tokens with 100 pages to spare: admission keeps that room
for them to grow, so the long prompt is refused. Each step stands in for the engine as
tests/unit/test_scheduler_unit.py does: scheduled tokens become computed, blocks are keyed and released, and each
sequence gets one token. Prints the median and 90th percentile of schedule() in milliseconds.
"""
import argparse
import statistics
import time

import torch

from atomlite import SamplingParams
from atomlite.config import EngineConfig
from atomlite.engine.kv.kv_cache import KVCacheManager
from atomlite.engine.kv.kv_planner import budget_for, plan_kv_cache
from atomlite.engine.scheduler import Scheduler
from atomlite.engine.sequence import Sequence
from atomlite.model_ops.platform import Platform
from atomlite.plan import meta_model


def engine_step(sched: Scheduler) -> float:
    start = time.perf_counter()
    batch = sched.schedule()
    took = time.perf_counter() - start
    for seq, num_new in batch:
        seq.num_computed_tokens += num_new
        sched.kv.update_block_hashes(seq)
        sched.kv.release_out_of_window(seq)
        if seq.num_uncomputed == 0:
            seq.token_ids.append(7 + len(seq.token_ids) % 1000)
    return took


def scheduler_for(args) -> Scheduler:
    config = EngineConfig(model=args.model, dtype="bfloat16", device="cpu", max_model_len=args.max_model_len)
    specs = meta_model(config, Platform()).kv_specs(torch.bfloat16)
    budget = budget_for(specs, 16, args.prompt_len + args.steps + 16, args.running)
    plan = plan_kv_cache(specs, budget, 16, args.max_model_len)
    kv = KVCacheManager(specs, plan.num_pages + 100, 16, torch.device("meta"))
    scheduler = Scheduler(kv, max_num_seqs=2 * args.running, max_num_batched_tokens=8192,
                          max_model_len=args.max_model_len)
    return scheduler


def timed(args, waiting: bool) -> list[float]:
    sched = scheduler_for(args)
    for i in range(args.running):
        sched.add(Sequence([100 + i] * args.prompt_len, SamplingParams(max_tokens=args.steps + 16, ignore_eos=True)))
    while sched.waiting:  # admit and prefill them all
        engine_step(sched)
    assert len(sched.running) == args.running
    if waiting:
        sched.add(Sequence(list(range(args.waiting_len)), SamplingParams(max_tokens=256)))
    times = [engine_step(sched) for _ in range(args.steps)]
    assert len(sched.waiting) == int(waiting) and len(sched.running) == args.running
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="examples/configs/gemma-4-31B-it")
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--waiting-len", type=int, default=32768)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    for waiting in (False, True):
        times = sorted(timed(args, waiting))
        label = f"{args.waiting_len}-token prompt waiting" if waiting else "nothing waiting"
        print(f"schedule() with {args.running} running, {label}: median {statistics.median(times) * 1e3:.3f} ms, "
              f"p90 {times[int(0.9 * len(times))] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
