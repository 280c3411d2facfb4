"""FP8-Dynamic GEMMs at decode batches of 64-512 rows (31B's four projections): torch's row-scaled scaled_mm
(cuBLASLt / CUTLASS), which fp8_gemm takes beyond LIBRARY_MIN_ROWS, against the Triton fp8 GEMM on each tile
config, and both against bf16 on the same weights. Timed as decode runs them (bench/fp4_gemm.py's time_ms: CUDA
graphs, L2 flushed, best of 3 rounds); x is quantized beforehand (the quantization is timed on its own). Each
Triton config is checked against the library's result first.

    PYTHONPATH=. python bench/fp8_rows_sweep.py [--ms 64,128,192,256,512]
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
           T(128, 128, 256, 8, 3), T(64, 128, 256, 4, 3)]


def triton_gemm(xq, xs, w, ws, config):
    gemm.tile_config = lambda *args, **kwargs: config
    try:
        return gemm.scaled_mm(xq, xs, w, ws, 0, torch.bfloat16)
    finally:
        gemm.tile_config = TILE_CONFIG


TILE_CONFIG = gemm.tile_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="64,128,192,256,512")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for name, (n, k) in SHAPES.items():
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
            print("    " + "  ".join(f"{c.block_m}x{c.block_n}x{c.block_k}w{c.num_warps}s{c.num_stages}:{us[c]:.1f}"
                                     for c in configs), flush=True)


if __name__ == "__main__":
    main()
