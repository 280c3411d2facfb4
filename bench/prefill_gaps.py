"""Where a TTFT goes beyond its kernels, on a GPU: one prompt's whole TTFT (as `bench latency` times it) profiled,
the GPU's idle time inside it, and which host phase ran during each idle stretch.

    PYTHONPATH=. python bench/prefill_gaps.py --model examples/configs/gemma-4-31B-it --input-len 512,2048 \
        [--max-model-len 4096] [--repeats 3] [--tensor-parallel-size 2] [--launches K]

Random weights (--load-format dummy), bf16, the engine's defaults (prefill graphs on). The phases are the engine's
own methods, wrapped here in profiler ranges; the innermost range running when a GPU gap starts takes the gap. Under
tensor parallelism the profile is rank 0's: an all-reduce kernel's time includes its wait for the slowest rank. Last,
the host time of each prefill graph's launch alone (replay(), the GPU idle before it), per token bucket. --launches K
lists each launch of the K kernels that take the most time, in start order.
"""
import argparse
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from atomlite.config import EngineConfig
from atomlite.engine.llm_engine import LLMEngine
from atomlite.sampling_params import SamplingParams
from decode_profile import busy_fraction, kernel_events, summarize

PHASE_OWNERS = {"LLMEngine", "Scheduler", "ModelRunner", "StepInputBuilder", "PrefillGraphs", "StaticPrefillInputs"}
GAP_US = 5.0  # idle stretches shorter than this are launch latency, not host work


def phases(engine) -> list[tuple[object, str]]:
    runner = engine.runner
    found = [(engine, "_run_scheduled"), (engine, "_take_tokens"), (engine, "_sample"), (engine, "_update"),
             (engine, "_record_prompt_logprobs"), (engine.scheduler, "schedule"),
             (engine.scheduler, "update_from_output"), (runner, "execute"), (runner, "_logits"),
             (runner.inputs, "build"), (runner, "_send")]
    if runner.prefill_graphs is not None:
        found += [(runner.prefill_graphs, "run"), (runner.prefill_graphs.inputs, "fill")]
    return found


@contextmanager
def labelled(engine, host_seconds: dict[str, list[float]] | None = None):
    """Each phase method of the engine runs inside a profiler range named after it; with host_seconds, each call's
    host time is appended there too (under its label)."""
    originals = []
    for owner, name in phases(engine):
        method = getattr(owner, name)
        originals.append((owner, name, method))

        def wrapped(*args, _method=method, _label=f"{type(owner).__name__}.{name}", **kwargs):
            start = time.perf_counter()
            with record_function(_label):
                result = _method(*args, **kwargs)
            if host_seconds is not None:
                host_seconds[_label].append(time.perf_counter() - start)
            return result
        setattr(owner, name, wrapped)
    try:
        yield
    finally:
        for owner, name, method in originals:
            setattr(owner, name, method)


def time_to_first_token(engine, prompt: list[int]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.add_request(f"ttft-{start}", prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def gaps(kernels, start_us: float, end_us: float) -> list[tuple[float, float]]:
    """GPU idle stretches (start, length) of at least GAP_US between start_us and end_us."""
    found, latest = [], start_us
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        if e.time_range.start - latest >= GAP_US:
            found.append((latest, e.time_range.start - latest))
        latest = max(latest, e.time_range.end)
    if end_us - latest >= GAP_US:
        found.append((latest, end_us - latest))
    return found


def innermost(ranges, at_us: float) -> str:
    running = [r for r in ranges if r.time_range.start <= at_us < r.time_range.end]
    return min(running, key=lambda r: r.time_range.end - r.time_range.start).name if running else "(no phase)"


def phase_ranges(prof) -> list:
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU and "." in e.name
            and e.name.split(".")[0] in PHASE_OWNERS]


def kernels_of(prof, ranges: list) -> list:
    """The profile's kernels: a phase's range also shows on the GPU's timeline, spanning its kernels, but it is not
    one (and it would hide their gaps)."""
    labels = {r.name for r in ranges}
    return [e for e in kernel_events(prof) if e.name not in labels]


def report(prof, wall_us: float) -> list[str]:
    ranges = phase_ranges(prof)
    kernels = kernels_of(prof, ranges)
    t0 = min(r.time_range.start for r in ranges)
    idle = gaps(kernels, t0, t0 + wall_us)
    by_phase = defaultdict(float)
    for start, length in idle:
        by_phase[innermost(ranges, start + 0.5)] += length
    lines = [f"  profiled TTFT {wall_us / 1e3:.2f} ms, GPU busy {busy_fraction(kernels, wall_us):.1%}, "
             f"{len(idle)} gaps of >= {GAP_US:.0f} us: {sum(g for _, g in idle) / 1e3:.2f} ms"]
    lines += [f"    {t / 1e3:7.3f} ms  {name}" for name, t in sorted(by_phase.items(), key=lambda x: -x[1])]
    lines.append("  phases (ms after the first; host time):")
    for r in sorted(ranges, key=lambda r: r.time_range.start):
        lines.append(f"    {(r.time_range.start - t0) / 1e3:8.3f} {(r.time_range.end - r.time_range.start) / 1e3:8.3f}"
                     f"  {r.name}")
    longest = sorted(idle, key=lambda g: -g[1])[:8]
    lines.append("  longest gaps (ms after the first phase, us):")
    lines += [f"    {(s - t0) / 1e3:8.3f} {g:8.1f}  {innermost(ranges, s + 0.5)}" for s, g in longest]
    return lines + summarize(kernels, 1)


def launches(kernels, top: int) -> list[str]:
    """The top kernels by total time, each with its launches' durations in start order: within one prefill the same
    shapes repeat layer after layer, so their trend shows the GPU's clock over the prefill."""
    by_name = defaultdict(list)
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        by_name[e.name[:90]].append(e.device_time)
    lines = ["  launches of the top kernels (us, in start order):"]
    for name, times in sorted(by_name.items(), key=lambda x: -sum(x[1]))[:top]:
        lines.append(f"    {sum(times) / 1e3:8.3f} ms {len(times):4d}  {name}")
        lines.append("      " + " ".join(f"{t:.0f}" for t in times))
    return lines


def launch_times(graphs, repeats: int = 10) -> str:
    """Host microseconds of one replay() call of each bucket's graph, the GPU idle before it (median)."""
    if graphs is None or not graphs.graphs:
        return "prefill graphs: none captured"
    found = []
    for bucket, graph in sorted(graphs.graphs.items()):
        graphs.fill_padding_alone(bucket)  # the inputs a capture saw: valid for this bucket, no KV written
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            graph.replay()
            times.append(time.perf_counter() - start)
        found.append(f"{bucket}: {statistics.median(times) * 1e6:.0f}")
    torch.cuda.synchronize()
    return "prefill graph launch, host us by token bucket: " + ", ".join(found)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--input-len", default="2048", help="prompt lengths, comma-separated")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--launches", type=int, default=0, metavar="K",
                   help="also list each launch's duration of the K kernels that take the most time")
    args = p.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, load_format="dummy", dtype="bfloat16",
                                    max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                    tensor_parallel_size=args.tensor_parallel_size))
    print(f"device: {torch.cuda.get_device_name()}; {engine.graph_note}", flush=True)
    g = torch.Generator().manual_seed(0)

    for length in map(int, args.input_len.split(",")):
        def prompt():
            return torch.randint(3, engine.vocab_size, (length,), generator=g).tolist()

        time_to_first_token(engine, prompt())  # warm-up at this length
        plain = [time_to_first_token(engine, prompt()) * 1e3 for _ in range(args.repeats)]
        print(f"TTFT {length} tokens, unprofiled: median {statistics.median(plain):.2f} ms "
              f"({', '.join(f'{t:.2f}' for t in plain)})")
        host = defaultdict(list)
        with labelled(engine, host):
            timed = [time_to_first_token(engine, prompt()) * 1e3 for _ in range(args.repeats)]
        print(f"  host time of each phase, no profiler (median ms; TTFT {statistics.median(timed):.2f}): "
              + ", ".join(f"{label} {statistics.median(t) * 1e3:.3f}" for label, t in host.items()))
        with labelled(engine):
            time_to_first_token(engine, prompt())
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                wall_us = time_to_first_token(engine, prompt()) * 1e6
        print("\n".join(report(prof, wall_us)), flush=True)
        if args.launches:
            print("\n".join(launches(kernels_of(prof, phase_ranges(prof)), args.launches)), flush=True)
    if args.tensor_parallel_size == 1:  # a graph with all-reduces replays only beside the other ranks' replays
        print(launch_times(engine.runner.prefill_graphs))
    engine.close()


if __name__ == "__main__":
    main()
