"""FP8-Dynamic GEMMs at decode batches of 64-512 rows (31B's four projections): torch's row-scaled scaled_mm
(cuBLASLt / CUTLASS), which fp8_gemm takes beyond LIBRARY_MIN_ROWS, against the Triton fp8 GEMM on each tile
config, and both against bf16 on the same weights. Timed as decode runs them (bench/fp4_gemm.py's time_ms: CUDA
graphs, L2 flushed, best of 3 rounds); x is quantized beforehand (the quantization is timed on its own). Each
Triton config is checked against the library's result first.

    PYTHONPATH=. python bench/fp8_rows_sweep.py [--ms 64,128,192,256,512] [--shapes qkv,o,gate_up,down] [--block]

--block: FP8-block weights (128 x 128 scales) and x in groups of 128, where the library is cuBLAS's 1x128 block
scaling; each side's time then includes its x quantization (fp8_gemm's library path quantizes its padded rows).
"""
import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp4_gemm import time_ms  # noqa: E402

from atomlite.model_ops.triton.fp8.quant import quantize_rows  # noqa: E402
from atomlite.model_ops.triton.fp8.tuning import FP8TileConfig as T  # noqa: E402

gemm = importlib.import_module("atomlite.model_ops.triton.fp8.gemm")

SHAPES = {"qkv": (16384, 5376), "o": (5376, 8192), "gate_up": (43008, 5376), "down": (5376, 21504)}
CONFIGS = [T(64, 128, 128, 4, 4), T(128, 128, 128, 8, 3), T(128, 128, 128, 8, 4), T(128, 64, 128, 4, 4),
           T(256, 128, 128, 8, 3), T(128, 256, 128, 8, 3), T(256, 64, 128, 8, 3), T(64, 256, 128, 8, 3),
           T(128, 128, 256, 8, 3), T(64, 128, 256, 4, 3),
           # 256 W rows a tile, K split until the GPU holds one program per multiprocessor: each tile re-reads x from
           # L2 (M x K bytes), so fewer, wider tiles leave more of each multiprocessor's loads in flight to W
           T(128, 256, 128, 8, 3, split_k=True, programs_per_sm=1), T(128, 256, 64, 8, 4, split_k=True,
                                                                     programs_per_sm=1),
           # x rows as 128 + 32 (or 64): at 129-192 rows the MMAs multiply no more than 31 padded rows, where the
           # 256-row tile multiplies 64-127 (gemm.scaled_tile's TAIL_M)
           T(128, 128, 128, 8, 3, tail_m=32), T(128, 128, 128, 8, 4, tail_m=32), T(128, 128, 128, 4, 2, tail_m=32),
           T(128, 128, 128, 8, 3, tail_m=64), T(64, 128, 128, 4, 4, tail_m=32), T(128, 256, 128, 8, 3, tail_m=32),
           # o and down (N = 5376: 42 W tiles of 128 rows) fill the GPU by splitting K
           T(128, 128, 128, 8, 3, split_k=True, programs_per_sm=1, tail_m=32),
           T(128, 64, 128, 4, 3, split_k=True, programs_per_sm=2, tail_m=32),
           T(128, 64, 128, 4, 3, split_k=True, programs_per_sm=2),
           T(64, 64, 128, 4, 3, split_k=True, programs_per_sm=2)]


def tile_name(c) -> str:
    rows = f"{c.block_m}+{c.tail_m}" if c.tail_m else f"{c.block_m}"
    return f"{rows}x{c.block_n}x{c.block_k}w{c.num_warps}s{c.num_stages}" + ("/split-K" if c.split_k else "")


def triton_gemm(xq, xs, w, ws, config, scale_k=0):
    gemm.tile_config = lambda *args, **kwargs: config
    try:
        return gemm.scaled_mm(xq, xs, w, ws, scale_k, torch.bfloat16)
    finally:
        gemm.tile_config = TILE_CONFIG


def block_layer(n: int, k: int):
    """W [N, K] e4m3 with a scale per 128 x 128 block, stored per row of W (unit stride along N) as fp8_linear
    keeps them."""
    w16 = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    blocks = w16.float().reshape(n // 128, 128, k // 128, 128).abs().amax((1, 3)) / 448
    ws = blocks.repeat_interleave(128, 0)  # [N, K / 128]
    w = (w16.float() / ws.repeat_interleave(128, 1)).to(torch.float8_e4m3fn).contiguous()
    return w16, w, ws.t().contiguous().t()


def block_main(ms: list[int]) -> None:
    configs = [c for c in CONFIGS if c.block_k == 128]
    for name, (n, k) in SHAPES.items():
        w16, w, ws = block_layer(n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            want = gemm.library_block_mm(x, w, ws, 128).float()
            fns = {"bf16": lambda: torch.nn.functional.linear(x, w16),
                   "library": lambda: gemm.library_block_mm(x, w, ws, 128)}
            for c in configs:
                def call(c=c):
                    xq, xs = quantize_rows(x, "group", torch.float8_e4m3fn, 128)
                    return triton_gemm(xq, xs, w, ws, c, scale_k=128)
                err = ((call().float() - want).norm() / want.norm()).item()
                if err > 1e-2:
                    print(f"  {c}: relative error {err:.2e} against the library")
                    continue
                fns[c] = call
            us = {key: value * 1e3 for key, value in time_ms(fns).items()}
            tiles = [c for c in fns if not isinstance(c, str)]
            best = min(tiles, key=us.get)
            print(f"block {name} {n}x{k} M={m}: bf16 {us['bf16']:.1f}  library {us['library']:.1f} "
                  f"({us['bf16'] / us['library']:.2f}x)  best triton {us[best]:.1f} ({us['bf16'] / us[best]:.2f}x) "
                  f"{tile_name(best)}", flush=True)


TILE_CONFIG = gemm.tile_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="64,128,192,256,512")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of " + ",".join(SHAPES))
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if args.block:
        return block_main([int(m) for m in args.ms.split(",")])
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w16 = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        ws = (w16.float().abs().amax(1, keepdim=True) / 448).contiguous()
        w = (w16.float() / ws).to(torch.float8_e4m3fn).contiguous()
        for m in map(int, args.ms.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            xq, xs = quantize_rows(x, "token", torch.float8_e4m3fn)
            want = gemm.library_scaled_mm(xq, xs, w, ws, torch.bfloat16).float()
            configs = []
            for c in CONFIGS:
                try:
                    got = triton_gemm(xq, xs, w, ws, c).float()
                except Exception as error:  # a tile that does not fit the GPU: said, not timed
                    print(f"  {c}: {type(error).__name__} {str(error)[:120]}")
                    continue
                err = ((got - want).norm() / want.norm()).item()
                if err > 1e-2:
                    print(f"  {c}: relative error {err:.2e} against the library")
                    continue
                configs.append(c)
            fns = {"bf16": lambda: torch.nn.functional.linear(x, w16),
                   "quantize": lambda: quantize_rows(x, "token", torch.float8_e4m3fn),
                   "library": lambda: gemm.library_scaled_mm(xq, xs, w, ws, torch.bfloat16)}
            fns |= {c: lambda c=c: triton_gemm(xq, xs, w, ws, c) for c in configs}
            us = {key: value * 1e3 for key, value in time_ms(fns).items()}
            best = min(configs, key=us.get) if configs else None
            print(f"{name} {n}x{k} M={m}: bf16 {us['bf16']:.1f}  quantize {us['quantize']:.1f}  library "
                  f"{us['library']:.1f} ({us['bf16'] / us['library']:.2f}x)  best triton {us.get(best, 0):.1f} "
                  f"({us['bf16'] / us[best]:.2f}x) {best}", flush=True)
            print("    " + "  ".join(f"{tile_name(c)}:{us[c]:.1f}" for c in configs), flush=True)


if __name__ == "__main__":
    main()
