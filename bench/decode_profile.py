"""Where a decode step's time goes, on a GPU: the step's wall time against one graph replay's GPU time (the rest is
host work), how busy the GPU is across whole steps in a torch profile, and the kernels that take the time.

    PYTHONPATH=. python bench/decode_profile.py --model examples/configs/gemma-4-31B-it [--batch 1] [--steps 16] \
        [--timeline K] [--tensor-parallel-size N]

Random weights (--load-format dummy), bf16. Also profiles one prefill of --input-len tokens (eager). Under tensor
parallelism the profile is rank 0's, and a graph is not replayed alone (its all-reduces would wait for the other
ranks): an all-reduce kernel's time there includes its wait for the slowest rank.
"""
import argparse
import re
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from atomlite.config import EngineConfig
from atomlite.engine.llm_engine import LLMEngine
from atomlite.sampling_params import SamplingParams

PROMPT_STEP = 1024  # the fewest prompt tokens a step takes while prompts wait (max_num_batched_tokens is larger)
CATEGORIES = [("gemm", r"gemm|gemv|cutlass|sm90_|nvjet|splitK|cublas"), ("attention", r"_attention_kernel"),
              ("split-KV combine", r"_combine_kernel"), ("norm", r"rms_norm"), ("rope", r"rope"),
              ("kv write", r"write_kv"), ("gelu", r"gelu"), ("mxfp4", r"mxfp4|lookup|fp8|quant|sum_splits")]


def category(name: str) -> str:
    return next((label for label, pattern in CATEGORIES if re.search(pattern, name, re.I)), "other")


def kernel_events(prof):
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0]


def busy_fraction(kernels, wall_us: float) -> float:
    """Union of kernel intervals over the profiled wall time."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy / wall_us


def summarize(kernels, steps: int) -> list[str]:
    by_cat, by_name, counts = defaultdict(float), defaultdict(float), defaultdict(int)
    for e in kernels:
        by_cat[category(e.name)] += e.device_time
        by_name[e.name[:90]] += e.device_time
        counts[e.name[:90]] += 1
    total = sum(by_cat.values())
    lines = [f"  {len(kernels) / steps:.0f} kernels per step, {total / steps / 1e3:.2f} ms of kernel time per step"]
    lines += [f"  {c:<18} {t / steps / 1e3:8.3f} ms  {t / total:5.1%}" for c, t in sorted(by_cat.items(),
                                                                                        key=lambda x: -x[1])]
    lines.append("  top kernels (ms per step, launches per step):")
    for name, t in sorted(by_name.items(), key=lambda x: -x[1])[:12]:
        lines.append(f"    {t / steps / 1e3:7.3f} {counts[name] / steps:6.1f}  {name}")
    return lines


def submit(engine, batch: int, input_len: int, max_tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, engine.vocab_size, (batch, input_len), generator=g).tolist()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [engine.add_request(f"p{seed}-{i}", p, params) for i, p in enumerate(prompts)]


def timeline(kernels, steps: int, count: int) -> list[str]:
    """count kernels from the middle of the last profiled step, in start order: when each starts (us after the
    first), how long it runs, and the gap since the latest end before it (negative: it overlaps one)."""
    ordered = sorted(kernels, key=lambda e: e.time_range.start)
    per_step = len(ordered) // steps
    first = len(ordered) - per_step // 2 - count // 2
    shown = ordered[first:first + count]
    lines = ["  timeline (us: start, duration, gap; stream):"]
    t0, latest_end = shown[0].time_range.start, shown[0].time_range.start
    for e in shown:
        start, end = e.time_range.start, e.time_range.end
        lines.append(f"    {start - t0:8.1f} {end - start:7.1f} {start - latest_end:7.1f}  "
                     f"{getattr(e, 'device_resource_id', '?'):>3}  {e.name[:70]}")
        latest_end = max(latest_end, end)
    return lines


def decode_tokens(batch: int, input_len: int, steps: int) -> int:
    """Tokens each request asks for: enough to decode through the timed and profiled steps after the batch's last
    prompt is in (an early request decodes one token in each later prompt step, of at least PROMPT_STEP tokens)."""
    return 2 * steps + 8 + -(-batch * input_len // PROMPT_STEP)


def profile_decode(engine, batch: int, input_len: int, steps: int, timeline_kernels: int = 0) -> list[str]:
    seqs = submit(engine, batch, input_len, decode_tokens(batch, input_len, steps), seed=1)
    while not all(s.output_token_ids for s in seqs):
        engine.step()
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    lines = [f"decode batch {batch}: step wall median {statistics.median(walls) * 1e3:.2f} ms"]
    graphs = engine.runner.graphs
    if graphs is not None and graphs.graphs and engine.config.tensor_parallel_size == 1:
        from atomlite.engine.runner.decode_graphs import bucket_for
        bucket = bucket_for(batch, graphs.sizes)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            graphs.graphs[bucket].replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        replay = statistics.median(times)
        host = statistics.median(walls) * 1e3 - replay
        lines.append(f"  graph replay alone (GPU): {replay:.2f} ms; the rest of the step (host work): {host:.2f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    kernels = kernel_events(prof)
    if not kernels:
        raise SystemExit("the profiled decode steps ran no kernel: the batch finished before them")
    lines.append(f"  profiled {steps} steps: {wall_us / steps / 1e3:.2f} ms per step, GPU busy "
                 f"{busy_fraction(kernels, wall_us):.1%}")
    lines += summarize(kernels, steps)
    if timeline_kernels:
        lines += timeline(kernels, steps, timeline_kernels)
    while engine.has_unfinished():
        engine.step()
    return lines


def profile_prefill(engine, input_len: int) -> list[str]:
    submit(engine, 1, input_len, 1, seed=2)  # warm-up at this length
    while engine.has_unfinished():
        engine.step()
    submit(engine, 1, input_len, 1, seed=3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    kernels = kernel_events(prof)
    lines = [f"prefill {input_len} tokens: {wall_us / 1e3:.2f} ms (profiled), GPU busy "
             f"{busy_fraction(kernels, wall_us):.1%}"]
    return lines + summarize(kernels, 1) + host_ops(prof)


def host_ops(prof, top: int = 15) -> list[str]:
    """The host calls that take the step's CPU time (launch APIs, syncs, Python-side ops), by self time."""
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    lines = ["  host calls by self CPU time (ms, calls):"]
    lines += [f"    {e.self_cpu_time_total / 1e3:7.2f} {e.count:6d}  {e.key[:80]}" for e in events]
    return lines


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--timeline", type=int, default=0, metavar="K",
                   help="also print K kernels of one step in start order, with the gaps between them")
    args = p.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, load_format="dummy", dtype="bfloat16",
                                    max_num_seqs=max(args.batch, 16),
                                    max_model_len=max(2048, args.input_len + decode_tokens(args.batch, args.input_len,
                                                                                           args.steps)),
                                    enforce_eager=args.enforce_eager,
                                    tensor_parallel_size=args.tensor_parallel_size,
                                    gpu_memory_utilization=args.gpu_memory_utilization))
    print(f"device: {torch.cuda.get_device_name()}; {engine.graph_note}; {engine.all_reduce_note}")
    print("\n".join(profile_decode(engine, args.batch, args.input_len, args.steps, args.timeline)), flush=True)
    print("\n".join(profile_prefill(engine, args.input_len)), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
