"""Where a verify step's extra time goes: one sequence's 1-token decode forward against its (k+1)-token verify
forward, per kernel (torch profiler, eager forwards on the same context; a graph replays the same kernels).

    PYTHONPATH=. python bench/verify_step.py --model examples/configs/gemma-4-31B-it [--drafts 4] [--context 512]

Random weights (--load-format dummy), bf16.
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from atomlite.config import EngineConfig
from atomlite.engine.llm_engine import LLMEngine
from atomlite.sampling_params import SamplingParams


def kernel_times(engine: LLMEngine, batch, repeats: int) -> tuple[dict[str, float], float]:
    """Per kernel name, microseconds per forward; and the wall milliseconds of one forward (synchronized)."""
    for _ in range(3):
        engine.runner.execute(batch)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        engine.runner.execute(batch)
    end.record()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            engine.runner.execute(batch)
        torch.cuda.synchronize()
    times = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            times[event.name[:90]] += event.device_time / repeats
    return times, start.elapsed_time(end) / repeats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--drafts", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, load_format="dummy", dtype="bfloat16", enforce_eager=True,
                                    max_num_seqs=1, max_model_len=args.context + 64))
    seq = engine.add_request("probe", list(range(3, args.context + 3)), SamplingParams(temperature=0, max_tokens=8))
    while seq.num_output_tokens < 2:
        engine.step()
    single, single_ms = kernel_times(engine, [(seq, 1)], args.repeats)
    seq.spec_token_ids = [5] * args.drafts
    verify, verify_ms = kernel_times(engine, [(seq, args.drafts + 1)], args.repeats)
    seq.spec_token_ids = []
    print(f"forward: 1 token {single_ms:.2f} ms, {args.drafts + 1} tokens {verify_ms:.2f} ms "
          f"({verify_ms / single_ms:.2f}x); GPU kernel sums {sum(single.values()) / 1e3:.2f} and "
          f"{sum(verify.values()) / 1e3:.2f} ms")
    names = sorted(set(single) | set(verify), key=lambda n: verify.get(n, 0) - single.get(n, 0), reverse=True)
    print(f"{'us (1 token)':>12} {'us (verify)':>12} {'delta':>8}  kernel")
    for name in names[:25]:
        a, b = single.get(name, 0.0), verify.get(name, 0.0)
        print(f"{a:12.1f} {b:12.1f} {b - a:8.1f}  {name}")


if __name__ == "__main__":
    main()
