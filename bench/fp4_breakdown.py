"""Where the small-M MXFP4 GEMM's time goes, on the GPU, for Gemma-4-31B shapes: the layer's path (pick_path,
activation quantization included) against its parts and against reads of the same weight bytes, all timed as
bench/fp4_gemm.py times (CUDA graphs, L2 flushed before every call):

- quant: the activation-quantization kernel alone;
- gemm: the GEMM kernel alone on already-quantized x (no dependent launch);
- read pattern: a Triton kernel that only reads the packed weight the way the GEMM does (64 rows x 128 bytes per
  program and 256-K step, with the GEMM's programs and K split) and sums it;
- read: a contiguous read of the same bytes (16 KiB per program), the bandwidth floor;
- bf16: torch's bf16 GEMM, for the speedup targets.

For M from 128 rows (the block-scaled fp8 path on Hopper) it prints the path against its parts instead: the
activation quantization, the expansion of the whole weight to e4m3, cuBLAS's block-scaled GEMM alone on both, a
copy of x, and bf16.

    PYTHONPATH=. python bench/fp4_breakdown.py [--ms 1,16,2048]
"""
import argparse
import importlib
import sys

import torch
import triton
import triton.language as tl

from fp4_gemm import SHAPES, make_weight, quantize_activations, time_ms

fp4 = importlib.import_module("atomlite.model_ops.triton.mxfp4.gemm")
fp8 = importlib.import_module("atomlite.model_ops.triton.mxfp4.fp8_tiles")
lookup = importlib.import_module("atomlite.model_ops.triton.mxfp4.lookup")
blockwise = importlib.import_module("atomlite.model_ops.triton.mxfp4.blockwise")


@triton.jit
def _read_pattern_kernel(w, out, stride_wn, STEPS, STEPS_PER_SPLIT):
    """Sum of one program's weight tiles: 64 rows x 32 int32 words (one 256-K step) at a time."""
    rows = tl.program_id(0) * 64 + tl.arange(0, 64)
    first = tl.program_id(1) * STEPS_PER_SPLIT
    acc = tl.zeros((64, 32), dtype=tl.int32)
    for step in range(first, tl.minimum(first + STEPS_PER_SPLIT, STEPS)):
        acc += tl.load(w + rows[:, None].to(tl.int64) * stride_wn + step * 32 + tl.arange(0, 32)[None, :])
    tl.store(out + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def _read_kernel(w, out, CHUNK_WORDS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * CHUNK_WORDS
    acc = tl.zeros((1024,), dtype=tl.int32)
    for i in range(0, CHUNK_WORDS, 1024):
        acc += tl.load(w + base + i + tl.arange(0, 1024))
    tl.store(out + tl.program_id(0), tl.sum(acc))


def read_pattern(words: torch.Tensor, out: torch.Tensor, split_k: int) -> None:
    steps = words.shape[1] // 32
    _read_pattern_kernel[(words.shape[0] // 64, split_k)](words, out, words.stride(0), steps,
                                                           triton.cdiv(steps, split_k), num_warps=4, num_stages=3)


def read(words: torch.Tensor, out: torch.Tensor) -> None:
    chunk = 4096  # words: 16 KiB per program
    _read_kernel[(words.numel() // chunk,)](words, out, CHUNK_WORDS=chunk, num_warps=4)


def gemm_alone(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, path):
    """The small-M path's GEMM kernel on x quantized beforehand, without dependent launch."""
    quantized = quantize_activations(x, weight.shape[1] * 2, path)
    if isinstance(path, lookup.LookupConfig):
        return lambda: lookup.lookup_gemm(quantized, x, weight, weight_scale, path, pdl=False)
    return lambda: fp8.fp8_gemm(quantized, x.shape[0], x.dtype, weight, weight_scale, path, pdl=False)


def blockwise_parts(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> dict:
    """The block-scaled path's weight expansion (all rows at once) and its GEMM alone on operands ready."""
    n, k_padded = weight.shape[0], weight.shape[1] * 2
    wq = torch.empty((n, k_padded), dtype=torch.float8_e4m3fn, device="cuda")
    flat = torch.empty(n * k_padded // blockwise.GROUP, device="cuda")
    quantized = blockwise.quantize_activations(x, k_padded)
    _, factors = blockwise.expand_weight(weight, weight_scale, wq, flat)
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device="cuda")
    return {"expand": lambda: blockwise.expand_weight(weight, weight_scale, wq, flat),
            "gemm": lambda: blockwise.blockwise_scaled_mm(*quantized, wq, factors, out),
            "x copy": lambda: x.clone()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="1,16", help="comma-separated row counts M")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    print(f"{'N x K':>12} {'M':>3} {'MB':>5} | {'path':>5} {'quant':>6} {'gemm':>6} {'pattern':>8} {'read':>6} "
          f"{'bf16':>6} (us) | path config")
    for i, (n, k) in enumerate(SHAPES):
        packed, scale, w_ref = make_weight(n, k, seed=i)
        weight, weight_scale = fp4.pad_to_k_align(packed, scale)
        wide, lookup_ok = fp4.needs_wide_scales(weight_scale), lookup.scale_bytes_fit(weight, weight_scale)
        words = weight.view(torch.int32)
        out = torch.empty(words.numel() // 1024, dtype=torch.int32, device="cuda")
        w_bf16 = w_ref.to(torch.bfloat16)
        for m in map(int, args.ms.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            path = fp4.pick_path(m, n, x, True, wide, lookup_ok)
            if isinstance(path, blockwise.BlockwiseConfig):
                fns = {"path": lambda: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, lookup_scales=lookup_ok),
                       "quant": lambda: quantize_activations(x, weight.shape[1] * 2, path),
                       **blockwise_parts(x, weight, weight_scale),
                       "bf16": lambda: torch.nn.functional.linear(x, w_bf16)}
                t = {name: ms * 1e3 for name, ms in time_ms(fns).items()}
                print(f"{n:>5} x {k:<5} {m:>4}: " + " ".join(f"{name} {us:.1f}" for name, us in t.items()) +
                      f" (us) | {path}", flush=True)
                continue
            if not isinstance(path, (lookup.LookupConfig, fp8.Fp8Config)):
                print(f"M={m}: neither a small-M nor the block-scaled path ({type(path).__name__}), skipped")
                continue
            fns = {"path": lambda: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, lookup_scales=lookup_ok),
                   "quant": lambda: quantize_activations(x, weight.shape[1] * 2, path),
                   "gemm": gemm_alone(x, weight, weight_scale, path),
                   "pattern": lambda: read_pattern(words, out, path.split_k),
                   "read": lambda: read(words, out),
                   "bf16": lambda: torch.nn.functional.linear(x, w_bf16)}
            t = {name: ms * 1e3 for name, ms in time_ms(fns).items()}
            print(f"{n:>5} x {k:<5} {m:>3} {words.numel() * 4 / 1e6:5.1f} | {t['path']:5.1f} {t['quant']:6.1f} "
                  f"{t['gemm']:6.1f} {t['pattern']:8.1f} {t['read']:6.1f} {t['bf16']:6.1f}      | {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
