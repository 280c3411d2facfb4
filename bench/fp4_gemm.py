"""MXFP4 GEMM (Triton, packed weights read directly) vs torch bf16 GEMM, on the GPU, for Gemma-4-31B shapes.

Checks the kernel against the torch reference first, then times both in the same run (median, L2 flushed between
runs by do_bench) and prints speedup = bf16 time / fp4 time. The fp4 path is the layer's: dynamic MXFP4 activation
quantization included. --sweep also times candidate tile configs and prints the best per shape.

    PYTHONPATH=. python bench/fp4_gemm.py [--sweep]
"""
import argparse
import importlib
import sys

import torch
import triton

from atomlite.quant import mxfp4

# the module, not the function of the same name that atomlite.model_ops.triton exports
fp4 = importlib.import_module("atomlite.model_ops.triton.mxfp4_gemm")

SHAPES = [(21504, 5376), (5376, 21504), (8192, 5376)]  # N x K: gate/up, down, qkv-sized
MS = [1, 16, 64, 256, 2048]
C = fp4.GemmConfig
CANDIDATES = {
    "decode": [C(16, 64, 256, 4, 4), C(16, 64, 256, 4, 4, prefetch=True),
               C(16, 64, 256, 4, 4, prefetch=True, split_k=2), C(16, 64, 128, 4, 4, prefetch=True, split_k=4),
               C(16, 64, 256, 4, 6, prefetch=True, split_k=2), C(16, 128, 256, 4, 3, prefetch=True),
               C(16, 64, 128, 4, 4, prefetch=True), C(16, 128, 128, 8, 4, prefetch=True)],
    "prefill": [C(128, 128, 64, 8, 3), C(128, 128, 64, 8, 3, prefetch=True), C(128, 128, 128, 8, 3),
                C(128, 256, 64, 8, 3), C(64, 128, 128, 4, 3), C(256, 128, 64, 8, 3)],
}


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected).norm() / expected.norm()).item()


def make_weight(n: int, k: int, seed: int, std: float = 0.02):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packed, scale = mxfp4.quantize(torch.randn(n, k, device="cuda", generator=gen) * std)
    return packed, scale, mxfp4.dequantize(packed, scale)


def check(packed, scale, w_ref, wide: bool, seed: int, candidates: bool) -> list[str]:
    """The default path at several M, and with candidates=True every candidate config, against torch."""
    failures = []
    weight, weight_scale = fp4.pad_to_k_align(packed, scale)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    runs = [(m, None) for m in (1, 16, 100, 2048)]
    if candidates:
        runs += [(m, config) for m, regime in ((5, "decode"), (300, "prefill")) for config in CANDIDATES[regime]]
    for m, config in runs:
        x = torch.randn(m, w_ref.shape[1], device="cuda", generator=gen).to(torch.bfloat16)
        for quantize_x in (True, False):
            xr = mxfp4.quantize_dequantize(x.float()) if quantize_x else x.float()
            expected = xr @ w_ref.T
            got = fp4.mxfp4_gemm(x, weight, weight_scale, quantize_x, wide, config)
            err = relative_error(got, expected)
            if not err < 4e-3 or torch.isnan(got).any():
                failures.append(f"N={w_ref.shape[0]} K={w_ref.shape[1]} M={m} quantize_x={quantize_x} "
                                f"wide={wide} config={config}: relative error {err:.2e}")
    return failures


SHOWN_CONSTANTS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "PREFETCH", "SPLIT_K", "PTX", "WIDE_SCALES")
PTX_OPS = [("ld.v4", "ld.global.v4"), ("ld.v2", "ld.global.v2"), ("ld", "ld.global."), ("cp.async", "cp.async.c"),
           ("ld.shared", "ld.shared"), ("st.shared", "st.shared"), ("wgmma", "wgmma.mma_async"), ("mma", "mma.sync")]


def compile_stats() -> None:
    """Per compiled GEMM variant: registers, spills, shared memory and the kinds of loads and MMAs in its PTX."""
    names = fp4._mxfp4_gemm_kernel.arg_names
    for device_cache in fp4._mxfp4_gemm_kernel.device_caches.values():
        for kernel in device_cache[0].values():
            ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
            constants = {names[key[0]]: value for key, value in kernel.src.constants.items()
                         if names[key[0]] in SHOWN_CONSTANTS}
            counts = " ".join(f"{name}={ptx.count(op)}" for name, op in PTX_OPS)
            print(f"  {constants}: regs {kernel.n_regs} spills {kernel.n_spills} smem {kernel.metadata.shared} "
                  f"converts-in-loop {ttgir[ttgir.find('scf.for'):].count('convert_layout')} {counts}")


def time_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--compile-stats", action="store_true", help="print each compiled variant's PTX statistics")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    rows, failures = [], []
    for i, (n, k) in enumerate(SHAPES):
        packed, scale, w_ref = make_weight(n, k, seed=i)
        failures += check(packed, scale, w_ref, wide=fp4.needs_wide_scales(scale), seed=i, candidates=args.sweep)
        if i == 0:
            failures += check(packed, scale, w_ref, wide=True, seed=10, candidates=False)
            big, big_scale, big_ref = make_weight(n, k, seed=20, std=50.0)  # scale bytes above 128
            failures += check(big, big_scale, big_ref, wide=True, seed=11, candidates=False)
        weight, weight_scale = fp4.pad_to_k_align(packed, scale)
        wide = fp4.needs_wide_scales(weight_scale)
        w_bf16 = w_ref.to(torch.bfloat16)
        for m in MS:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_bf16 = time_ms(lambda: torch.nn.functional.linear(x, w_bf16))
            t_fp4 = time_ms(lambda: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide))
            t_quant = time_ms(lambda: fp4.quantize_dequantize(x))
            best = ""
            if args.sweep:
                regime = "decode" if m <= fp4.DECODE_MAX_M else "prefill"
                timed = [(time_ms(lambda c=c: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, c)), c)
                         for c in CANDIDATES[regime]]
                t_best, c = min(timed, key=lambda tc: tc[0])
                best = (f"  best {t_bf16 / t_best:5.2f}x {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps}"
                        f" s{c.num_stages} split{c.split_k}{' prefetch' if c.prefetch else ''}")
                print("   ", n, k, m, " ".join(f"{t * 1e3:.0f}" for t, _ in timed), flush=True)
            gbps = (n * k * 17 / 32) / (t_fp4 * 1e-3) / 1e9
            rows.append(f"{n:>6} {k:>6} {m:>5} {t_bf16 * 1e3:9.1f} {t_fp4 * 1e3:9.1f} {t_bf16 / t_fp4:7.2f}x "
                        f"{gbps:8.0f} {t_quant * 1e3:8.1f}{best}")
            print(rows[-1], flush=True)
    print("\n     N      K     M   bf16 us    fp4 us  speedup  fp4 GB/s (weights)  x-quant us (inside fp4 us)")
    print("\n".join(rows))
    if args.compile_stats:
        compile_stats()
    print("\ncheck vs torch reference:", "FAILED\n  " + "\n  ".join(failures) if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
