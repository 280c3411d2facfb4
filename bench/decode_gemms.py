"""The decode GEMMs of a model at batch M (bf16): torch F.linear (cuBLAS / hipBLASLt) and atomlite's skinny Triton
GEMM (the config linear() picks, and each --sweep config) against a device copy of the same weight bytes, same GPU,
same run, each timed as CUDA graph replays of many calls over copies in rotation. Every kernel is first checked
against an fp32 reference on fresh random inputs.

    PYTHONPATH=. python bench/decode_gemms.py --model examples/configs/gemma-4-31B-it [--ms 1,16] [--sweep]
        [--partial-sums] [--tp 2]

Shapes come from the model built on the meta device (every Linear once, with how many layers have it).
"""
import argparse
import statistics
from collections import Counter

import torch
import torch.nn.functional as F

from atomlite.benchmarks.roofline import text_modules
from atomlite.config import EngineConfig
from atomlite.model_ops.triton.gemm.skinny import DEFAULT_CONFIG, SkinnyConfig, config_for, fits, skinny_gemm
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
    p.add_argument("--sweep", action="store_true", help="Also time each SWEEP config.")
    p.add_argument("--partial-sums", action="store_true",
                   help="Leave split-K partials unsummed, as for a consumer that adds them (a norm, the q/k prepare).")
    p.add_argument("--tp", type=int, default=1,
                   help="One rank's shapes under this tensor parallelism: o_proj and down_proj split K, every other "
                        "linear N (as 31B shards; a replicated linear, such as 26B-A4B's router, is split too).")
    args = p.parse_args()
    shapes = linear_shapes(args.model, args.tp)
    sweep = SWEEP if args.sweep else []
    print(f"device: {torch.cuda.get_device_name()}")
    for i, c in enumerate(sweep):
        print(f"config {i}: {c}")
    for m in map(int, args.ms.split(",")):
        totals = {"cublas": 0.0, "copy": 0.0, "picked": 0.0, **{c: 0.0 for c in sweep}}
        print(f"\nM = {m}: {'N x K':>16} {'layers':>6} {'cuBLAS us':>9} {'TB/s':>6} {'skinny us':>9} {'TB/s':>6} "
              f"{'copy us':>8} {'max err':>8}  (skinny: the config linear() picks)")
        for (n, k), count in sorted(shapes.items()):
            times, err = time_shape(m, n, k, sweep, args.partial_sums)
            for key in totals:
                totals[key] += times[key] * count
            gb = n * k * 2 / 1e6
            print(f"{'':8} {n:>7} x {k:<7} {count:6} {times['cublas']:9.1f} {gb / times['cublas']:6.2f} "
                  f"{times['picked']:9.1f} {gb / times['picked']:6.2f} {times['copy']:8.1f} {err:8.1e}")
            if sweep:
                print(f"{'':10} each config (us): " + ", ".join(f"{i}: {times[c]:.1f}" for i, c in enumerate(sweep)))
        print(f"{'':8} whole step: cuBLAS {totals['cublas'] / 1e3:.2f} ms, copies of the same bytes "
              f"{totals['copy'] / 1e3:.2f} ms, skinny as picked {totals['picked'] / 1e3:.2f} ms")
        for c in sweep:
            print(f"{'':8} skinny {c}: {totals[c] / 1e3:.2f} ms ({totals[c] / totals['copy']:.2f}x copy)")


def time_shape(m: int, n: int, k: int, sweep: list[SkinnyConfig], partial_sums: bool) -> tuple[dict, float]:
    """Each way's time of x [m, k] W^T for W [n, k] (torch's GEMM, the picked skinny config, each sweep config,
    the copy of W's bytes), and the skinny kernel's largest relative error against fp32. Weights and copies rotate
    through ROTATION_BYTES so that no call finds its bytes in L2."""
    copies = max(3, -(-ROTATION_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    sources = [torch.empty(n * k // 2, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(copies)]
    targets = [torch.empty_like(sources[0]) for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    state = {"i": 0}

    def rotating(fn):
        def call():
            state["i"] = (state["i"] + 1) % copies
            return fn(state["i"])
        return call

    def skinny(config: SkinnyConfig):
        return lambda i: skinny_gemm(x, weights[i], config, summed=not partial_sums)

    calls = 2 * copies
    times = {"cublas": time_us(rotating(lambda i: F.linear(x, weights[i])), calls),
             "copy": time_us(rotating(lambda i: targets[i].copy_(sources[i])), calls)}
    err = 0.0
    picked = config_for(n, k, torch.device("cuda"))
    for key, config in [("picked", picked)] + [(c, c) for c in sweep]:
        if fits(x, weights[0], config):
            err = max(err, check(m, n, k, config))
            times[key] = time_us(rotating(skinny(config)), calls)
        else:
            times[key] = times["cublas"]
    return times, err


if __name__ == "__main__":
    main()
