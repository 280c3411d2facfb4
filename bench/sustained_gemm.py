"""How the GPU's matmul rate holds up under sustained load: the roofline's GEMM probe (atomlite.benchmarks.roofline,
a short burst of 8192^3 bf16 matmuls) against the same matmuls, and 31B's prefill gate_up (2048 x 5376 -> 43008),
run back to back for --ms milliseconds, each call timed by CUDA events, reported in windows of --window ms.

    PYTHONPATH=. python bench/sustained_gemm.py [--ms 400] [--window 50]

A long prefill (31B at 2048 tokens: about 170 ms of GEMMs) runs at the sustained rate, the probe at the burst one.
"""
import argparse
import time

import torch

from atomlite.benchmarks.roofline import probe


def sustained(a: torch.Tensor, b: torch.Tensor, ms: float) -> list[tuple[float, float]]:
    """(start ms, duration ms) of each a @ b run back to back for about ms milliseconds."""
    (a @ b).float().sum().item()
    probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_start.record()
    a @ b
    probe_end.record()
    probe_end.synchronize()
    calls = max(1, int(ms / probe_start.elapsed_time(probe_end)))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    events[0].record()
    for i in range(calls):
        a @ b
        events[i + 1].record()
    events[-1].synchronize()
    return [(events[0].elapsed_time(events[i]), events[i].elapsed_time(events[i + 1])) for i in range(calls)]


def report(name: str, flops: float, timings: list[tuple[float, float]], window: float, burst: float) -> None:
    print(f"{name}: {len(timings)} calls in {timings[-1][0] + timings[-1][1]:.0f} ms")
    start = 0.0
    while start < timings[-1][0]:
        inside = [d for s, d in timings if start <= s < start + window]
        if inside:  # a window shorter than a call may start none
            rate = flops * len(inside) / (sum(inside) / 1e3)
            print(f"  {start:5.0f}-{start + window:<5.0f} ms  {rate / 1e12:6.1f} TFLOP/s  "
                  f"({rate / burst:.3f} of the probe)")
        start += window


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ms", type=float, default=400.0)
    p.add_argument("--window", type=float, default=50.0)
    args = p.parse_args()
    device = torch.device("cuda")
    burst = probe(device, torch.bfloat16).gemm_flops_per_s
    print(f"{torch.cuda.get_device_name()}: probe {burst / 1e12:.1f} TFLOP/s")
    torch.cuda.synchronize()
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    report("8192^3 (the probe's shape)", 2 * n**3, sustained(a, b, args.ms), args.window, burst)
    del a, b
    torch.cuda.synchronize()
    time.sleep(2.0)  # the GPU idle: the next shape starts as cool as the first did
    x = torch.randn(2048, 5376, device=device, dtype=torch.bfloat16)
    w = torch.randn(5376, 43008, device=device, dtype=torch.bfloat16) * 0.02
    report("2048 x 5376 -> 43008 (31B gate_up at 2048 tokens)", 2 * 2048 * 5376 * 43008, sustained(x, w, args.ms),
           args.window, burst)


if __name__ == "__main__":
    main()
