"""MXFP4 GEMM (Triton, packed weights read directly) vs torch bf16 GEMM, on the GPU, for Gemma-4-31B shapes.

Checks every path against the torch reference first (eagerly and replayed from a CUDA graph), then times both in
the same run (CUDA graphs, L2 flushed before every call: graph_ms) and prints speedup = bf16 time / fp4 time. The
fp4 path is the layer's (mxfp4_gemm.pick_path), dynamic MXFP4 activation quantization included.
--sweep also times candidate configs and prints the best per shape.

    PYTHONPATH=. python bench/fp4_gemm.py [--sweep] [--ms 1,2,16] [--compile-stats]
"""
import argparse
import importlib
import sys

import torch
import triton

from atomlite.model_ops.triton.mxfp4.tuning import FP8_MAX_M
from atomlite.quant import mxfp4

# the module, not the function of the same name that atomlite.model_ops.triton exports
fp4 = importlib.import_module("atomlite.model_ops.triton.mxfp4.gemm")
fp8 = importlib.import_module("atomlite.model_ops.triton.mxfp4.fp8_tiles")
lookup = importlib.import_module("atomlite.model_ops.triton.mxfp4.lookup")
blockwise = importlib.import_module("atomlite.model_ops.triton.mxfp4.blockwise")

SHAPES = [(21504, 5376), (5376, 21504), (8192, 5376)]  # N x K: gate/up, down, qkv-sized
MS = [1, 2, 16, 64, 256, 512, 2048]
SHOWN_CANDIDATES = 8  # --sweep prints the fastest of each shape and M
C, F, D, L, B = fp4.GemmConfig, fp8.Fp8Config, fp4.DequantizeConfig, lookup.LookupConfig, blockwise.BlockwiseConfig
CANDIDATES = {
    "decode": [F(2, 64, 4, 3, period=8), F(2, 64, 4, 4, period=8), F(2, 64, 4, 3, split_k=2, period=8),
               F(2, 64, 4, 3, split_k=4, period=8), F(4, 64, 4, 3, period=8), F(4, 64, 4, 3, split_k=2, period=8),
               F(4, 64, 4, 3, split_k=4, period=8), F(4, 64, 4, 3, split_k=4, period=4), F(8, 64, 4, 3, period=4),
               L(16, 64, 4, 3), L(16, 64, 4, 3, split_k=2), L(16, 64, 4, 3, split_k=4),
               C(16, 64, 256, 4, 4, prefetch=True)]
              + [F(2, n, 4, 3, split_k=k, period=8, tma=t) for n in (64, 128) for k in (1, 2, 3, 4, 6, 8)
                 for t in (False, True)],
    "fp8": [F(8, 64, 4, 3, period=4), F(8, 64, 4, 3, split_k=2, period=4), F(8, 64, 4, 3, split_k=4, period=4),
            F(8, 64, 4, 3, period=2), F(8, 64, 4, 3, split_k=4, period=2), F(8, 64, 4, 3, period=8),
            F(16, 64, 4, 3, period=2), F(16, 64, 4, 3, split_k=2, period=2), F(16, 64, 4, 3, split_k=4, period=2),
            F(16, 64, 4, 3, split_k=2, period=4), F(16, 64, 4, 3), F(32, 64, 4, 3), F(32, 64, 4, 3, period=2),
            L(16, 64, 4, 3), L(16, 64, 4, 4), L(16, 64, 4, 3, split_k=2), L(16, 64, 4, 3, split_k=4),
            L(32, 64, 4, 3), L(32, 64, 4, 3, split_k=2), L(32, 64, 4, 3, split_k=4), L(64, 64, 4, 3),
            L(64, 64, 4, 3, split_k=2), L(64, 64, 4, 3, split_k=4), C(16, 64, 256, 4, 4, prefetch=True)],
    "prefill": [C(128, 128, 64, 8, 3), C(256, 128, 64, 8, 3), D(2048), D(4096), D(8192), D(16384), B(2048),
                B(4096), B(8192), B(16384), B(32768)],
}


def regime(m: int) -> str:
    return "decode" if m <= 4 else "fp8" if m <= FP8_MAX_M else "prefill"


def describe(config) -> str:
    if isinstance(config, D):
        return f"dequantize {config.rows} rows + torch.matmul"
    if isinstance(config, B):
        return f"e4m3 slabs of {config.rows} rows + blockwise scaled_mm"
    kind = f"fp8 period {config.period}" if isinstance(config, F) else "lookup" if isinstance(config, L) else "bf16"
    tma = " tma" if getattr(config, "tma", False) else ""
    tile = (f"{config.block_m}x{config.block_n}{tma}" if isinstance(config, (F, L))
            else f"{config.block_m}x{config.block_n}x{config.block_k}")
    extra = " prefetch" if getattr(config, "prefetch", False) else ""
    return f"{kind} {tile} w{config.num_warps} s{config.num_stages} split{config.split_k}{extra}"


def quantize_activations(x: torch.Tensor, k_padded: int, path):
    """The activation-quantization pass that path's fp4 call includes."""
    if isinstance(path, F):
        return fp8.quantize_activations(x, k_padded, path.period)
    if isinstance(path, L):
        return lookup.quantize_activations(x, k_padded, ptx=True)
    if isinstance(path, B):
        return blockwise.quantize_activations(x, k_padded)
    return fp4.quantize_dequantize(x)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected).norm() / expected.norm()).item()


def make_weight(n: int, k: int, seed: int, std: float = 0.02):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packed, scale = mxfp4.quantize(torch.randn(n, k, device="cuda", generator=gen) * std)
    return packed, scale, mxfp4.dequantize(packed, scale)


def check(packed, scale, w_ref, wide: bool, lookup_ok: bool, seed: int, regimes: set[str]) -> list[str]:
    """The default path at several M, and every candidate config of the regimes swept, against torch."""
    failures = []
    weight, weight_scale = fp4.pad_to_k_align(packed, scale)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    runs = [(m, None) for m in (1, 2, 5, 16, 17, 64, 100, 2048)]
    runs += [(m, config) for m in (2, 17, 600) if regime(m) in regimes for config in CANDIDATES[regime(m)]]
    for m, config in runs:
        x = torch.randn(m, w_ref.shape[1], device="cuda", generator=gen).to(torch.bfloat16)
        if isinstance(config, L) and not lookup_ok:
            continue
        for quantize_x in (True, False) if not isinstance(config, (F, L, B)) else (True,):
            xr = mxfp4.quantize_dequantize(x.float()) if quantize_x else x.float()
            expected = xr @ w_ref.T
            def call():
                return fp4.mxfp4_gemm(x, weight, weight_scale, quantize_x, wide, config, lookup_scales=lookup_ok)
            for how, got in (("eager", call()), ("graph", replayed(call))):
                err = relative_error(got, expected)
                if not err < 4e-3 or torch.isnan(got).any():
                    failures.append(f"N={w_ref.shape[0]} K={w_ref.shape[1]} M={m} quantize_x={quantize_x} "
                                    f"wide={wide} lookup={lookup_ok} config={config} {how}: relative error {err:.2e}")
    return failures


def replayed(fn) -> torch.Tensor:
    """fn's output from a CUDA graph replay, as timed (its launches as captured: side streams, dependent launch)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = fn()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    return out


SHOWN_CONSTANTS = ("BLOCK_M", "PERIOD", "BLOCK_N", "BLOCK_K", "PREFETCH", "SPLIT_K", "PTX", "WIDE_SCALES")
PTX_OPS = [("ld.v4", "ld.global.v4"), ("ld.v2", "ld.global.v2"), ("ld", "ld.global."), ("cp.async", "cp.async.c"),
           ("ld.shared", "ld.shared"), ("st.shared", "st.shared"), ("shfl", "shfl.sync"), ("wgmma", "wgmma.mma_async"),
           ("mma", "mma.sync")]


def compile_stats() -> None:
    """Per compiled GEMM variant: registers, spills, shared memory and the kinds of loads and MMAs in its PTX."""
    for jit in (fp4._mxfp4_gemm_kernel, fp8._fp8_gemm_kernel, lookup._lookup_gemm_kernel):
        print(f"  {jit.fn.__name__}")
        kernel_stats(jit)


def kernel_stats(jit) -> None:
    names = jit.arg_names
    for device_cache in jit.device_caches.values():
        for kernel in device_cache[0].values():
            ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
            constants = {names[key[0]]: value for key, value in kernel.src.constants.items()
                         if names[key[0]] in SHOWN_CONSTANTS}
            counts = " ".join(f"{name}={ptx.count(op)}" for name, op in PTX_OPS)
            print(f"  {constants}: regs {kernel.n_regs} spills {kernel.n_spills} smem {kernel.metadata.shared} "
                  f"converts-in-loop {ttgir[ttgir.find('scf.for'):].count('convert_layout')} {counts}")


ROUNDS = 3
CALLS_PER_GRAPH = 20


def graph_ms(fn, flush) -> float:
    """GPU time of one fn call: a CUDA graph of CALLS_PER_GRAPH (L2 flush, fn) pairs minus one of flushes alone,
    median of 10 replays each. Graphs, as a serving engine runs decode: timed eagerly, a 40 us kernel pair measured
    the Python launch cost instead (one config timed 42 and 91 us)."""
    graphs = []
    for body in ((lambda: (flush(), fn())), flush):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            body()  # warm the caching allocator on the capture stream
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(CALLS_PER_GRAPH):
                    body()
        torch.cuda.synchronize()
        graphs.append(graph)
    medians = []
    for graph in graphs:
        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        medians.append(sorted(times)[len(times) // 2])
    return (medians[0] - medians[1]) / CALLS_PER_GRAPH


def time_ms(fns: dict) -> dict:
    """Each fn's graph_ms, the best of ROUNDS rounds that each time every fn in turn, so that a slow spell of the
    lent GPU spoils one round only."""
    # Flushing by reading leaves clean lines: zeroing (do_bench's way) leaves 50 MB of dirty lines that the timed
    # call then writes back, about 15 us on an H100.
    l2_flush = torch.ones(64 * 2**20, dtype=torch.float32, device="cuda")
    for fn in fns.values():
        fn()  # compile outside the timing
    best = {}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            best[name] = min(best.get(name, float("inf")), graph_ms(fn, l2_flush.sum))
    return best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated row counts M to time")
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES),
                        help="comma-separated N x K weight shapes, e.g. 43008x5376 (the first also gets extra checks)")
    parser.add_argument("--unsummed", action="store_true",
                        help="time split-K outputs unsummed (PartialSums), as a consumer that adds them gets them")
    parser.add_argument("--compile-stats", action="store_true", help="print each compiled variant's PTX statistics")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    rows, failures = [], []
    ms = list(map(int, args.ms.split(",")))
    summed = not args.unsummed
    swept = {regime(m) for m in ms} if args.sweep else set()
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    for i, (n, k) in enumerate(shapes):
        packed, scale, w_ref = make_weight(n, k, seed=i)
        wide, lookup_ok = fp4.needs_wide_scales(scale), lookup.scale_bytes_fit(packed, scale)
        failures += check(packed, scale, w_ref, wide, lookup_ok, seed=i, regimes=swept)
        if i == 0:  # the fp8 tiles for 5-64 rows too, and the exact expansion for scales above 2
            failures += check(packed, scale, w_ref, wide=True, lookup_ok=False, seed=10, regimes=set())
            big, big_scale, big_ref = make_weight(n, k, seed=20, std=50.0)  # scale bytes above 128
            failures += check(big, big_scale, big_ref, wide=True, lookup_ok=lookup.scale_bytes_fit(big, big_scale),
                              seed=11, regimes=set())
        weight, weight_scale = fp4.pad_to_k_align(packed, scale)
        w_bf16 = w_ref.to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            path = fp4.pick_path(m, n, x, True, wide, lookup_ok)
            fns = {"bf16": lambda: torch.nn.functional.linear(x, w_bf16),
                   "fp4": lambda: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, lookup_scales=lookup_ok,
                                                 summed=summed),
                   "quant": lambda: quantize_activations(x, weight.shape[1] * 2, path)}
            candidates = [c for c in CANDIDATES[regime(m)] if lookup_ok or not isinstance(c, L)] if args.sweep else []
            fns.update({c: lambda c=c: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, c, lookup_scales=lookup_ok,
                                                       summed=summed)
                        for c in candidates})
            times = time_ms(fns)
            t_bf16, t_fp4, t_quant = times["bf16"], times["fp4"], times["quant"]
            best = ""
            if candidates:
                c = min(candidates, key=times.get)
                t_best = times[c]
                best = f"  best {t_bf16 / t_best:5.2f}x {describe(c)}"
                for c in sorted(candidates, key=times.get)[:SHOWN_CANDIDATES]:
                    print(f"    {n} {k} {m}: {times[c] * 1e3:.1f} us {describe(c)}", flush=True)
            gbps = (n * k * 17 / 32) / (t_fp4 * 1e-3) / 1e9
            rows.append(f"{n:>6} {k:>6} {m:>5} {t_bf16 * 1e3:9.1f} {t_fp4 * 1e3:9.1f} {t_bf16 / t_fp4:7.2f}x "
                        f"{gbps:8.0f} {t_quant * 1e3:8.1f}  {describe(path)}{best}")
            print(rows[-1], flush=True)
    print("\n     N      K     M   bf16 us    fp4 us  speedup  fp4 GB/s (weights)  x-quant us (inside fp4 us)  path")
    print("\n".join(rows))
    if args.compile_stats:
        compile_stats()
    print("\ncheck vs torch reference:", "FAILED\n  " + "\n  ".join(failures) if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
