"""The decode GEMMs of a model at batch M (bf16): torch F.linear (cuBLAS / hipBLASLt) and atomlite's skinny Triton
GEMM (each --sweep config) against a device copy of the same weight bytes, same GPU, same run, each timed as CUDA
graph replays of many calls over weight copies in rotation. Every kernel is first checked against an fp32 reference
on fresh random inputs.

    PYTHONPATH=. python bench/decode_gemms.py --model examples/configs/gemma-4-31B-it [--ms 1,16] [--sweep] [--tp 2]

Shapes come from the model built on the meta device (every Linear once, with how many layers have it).
"""
import argparse
import statistics
from collections import Counter

import torch
import torch.nn.functional as F

from atomlite.benchmarks.roofline import text_modules
from atomlite.config import EngineConfig
from atomlite.model_ops.triton.gemm.skinny import DEFAULT_CONFIG, SkinnyConfig, fits, skinny_gemm
from atomlite.model_ops.platform import Platform
from atomlite.plan import meta_model


ROW_PARALLEL = ("o_proj", "down_proj")  # under tensor parallelism these split K; the others split N


def linear_shapes(model_dir: str, tp: int = 1) -> Counter:
    """(N, K) -> layers, for one rank of tensor parallelism tp (the row-parallel linears' K, the others' N split)."""
    model = meta_model(EngineConfig(model=model_dir, dtype="bfloat16"), Platform())
    text = set(text_modules(model))  # decode never runs the tower
    shapes = Counter()
    for name, m in model.named_modules():
        if m in text and hasattr(m, "in_features") and hasattr(m, "out_features"):
            row_parallel = name.endswith(ROW_PARALLEL)
            shapes[(m.out_features // (1 if row_parallel else tp), m.in_features // (tp if row_parallel else 1))] += 1
    hf = model.spec.hf
    shapes[(hf["vocab_size"] // tp, hf["hidden_size"])] += 1  # tied lm_head, split by vocabulary
    return shapes


ROTATION_BYTES = 200 << 20  # four times the H200's L2
REPLAYS = 20

SWEEP = [DEFAULT_CONFIG, SkinnyConfig(64, 128, 4, 3, programs_per_sm=3), SkinnyConfig(32, 128, 4, 4, programs_per_sm=4),
         SkinnyConfig(64, 256, 4, 2, programs_per_sm=2), SkinnyConfig(32, 256, 4, 3, programs_per_sm=2),
         SkinnyConfig(64, 128, 4, 4, programs_per_sm=1), SkinnyConfig(64, 64, 4, 8, programs_per_sm=2),
         SkinnyConfig(64, 128, 4, 4, min_k_tiles=2), SkinnyConfig(32, 128, 4, 4),
         SkinnyConfig(32, 128, 4, 3, programs_per_sm=6), SkinnyConfig(64, 128, 8, 4),
         SkinnyConfig(128, 128, 8, 3, programs_per_sm=1), SkinnyConfig(32, 64, 4, 6, programs_per_sm=4)]


def check(m: int, n: int, k: int, config: SkinnyConfig) -> float:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w.float().T
    y = skinny_gemm(x, w, config)
    err = ((y.float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise SystemExit(f"skinny GEMM {config} wrong at {m}x{n}x{k}: relative error {err}")
    return err


def time_us(fn, calls: int) -> float:
    """One call's median time, fn() called `calls` times in a CUDA graph: launched as a captured decode step launches
    it (a bare call's host launch cost outlasts these kernels on a small model)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compiles, allocations
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--ms", default="1,16")
    p.add_argument("--sweep", action="store_true", help="Also time the other skinny configs.")
    p.add_argument("--partial-sums", action="store_true",
                   help="Leave split-K partials unsummed, as for a consumer that adds them (a norm, the q/k prepare).")
    p.add_argument("--tp", type=int, default=1, help="One rank's shapes under this tensor parallelism.")
    args = p.parse_args()
    shapes = linear_shapes(args.model, args.tp)
    configs = SWEEP if args.sweep else [DEFAULT_CONFIG]
    print(f"device: {torch.cuda.get_device_name()}")
    if args.sweep:
        for i, c in enumerate(configs):
            print(f"config {i}: {c}")
    for m in map(int, args.ms.split(",")):
        totals = {"cublas": 0.0, "copy": 0.0, **{c: 0.0 for c in configs}}
        print(f"\nM = {m}: {'N x K':>16} {'layers':>6} {'cuBLAS us':>9} {'TB/s':>6} {'skinny us':>9} {'TB/s':>6} "
              f"{'copy us':>8} {'max err':>8}")
        for (n, k), count in sorted(shapes.items()):
            # weight copies in rotation, so no call finds its weight in L2
            copies = max(3, -(-ROTATION_BYTES // (n * k * 2)))
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            src = torch.empty(n * k // 2, device="cuda", dtype=torch.bfloat16).normal_()
            dst = torch.empty_like(src)
            state = {"i": 0}

            def rotating(fn):
                def call():
                    state["i"] = (state["i"] + 1) % copies
                    return fn(x, weights[state["i"]])
                return call
            calls = 2 * copies
            times = {"cublas": time_us(rotating(F.linear), calls), "copy": time_us(lambda: dst.copy_(src), calls)}
            err = 0.0
            for c in configs:
                if fits(x, weights[0], c):
                    err = max(err, check(m, n, k, c))
                    times[c] = time_us(rotating(lambda a, b, c=c: skinny_gemm(a, b, c, summed=not args.partial_sums)),
                                       calls)
                else:
                    times[c] = times["cublas"]
            for key in totals:
                totals[key] += times[key] * count
            best = min(times[c] for c in configs)
            gb = n * k * 2 / 1e6
            print(f"{'':8} {n:>7} x {k:<7} {count:6} {times['cublas']:9.1f} {gb / times['cublas']:6.2f} "
                  f"{best:9.1f} {gb / best:6.2f} {times['copy']:8.1f} {err:8.1e}")
            if args.sweep:
                print(f"{'':10} each config (us): " + ", ".join(f"{i}: {times[c]:.1f}" for i, c in enumerate(configs)))
            del weights, src, dst
        print(f"{'':8} whole step: cuBLAS {totals['cublas'] / 1e3:.2f} ms, copies of the same bytes "
              f"{totals['copy'] / 1e3:.2f} ms")
        for c in configs:
            print(f"{'':8} skinny {c}: {totals[c] / 1e3:.2f} ms ({totals[c] / totals['copy']:.2f}x copy)")


if __name__ == "__main__":
    main()
