"""MXFP4 GEMMs of many rows on the weight's e4m3 copy (row_copy.py) against the packed weight's own path and bf16, at
Gemma-4-31B's four projection shapes, timed as bench/fp4_gemm.py times (CUDA graphs, L2 flushed before every call).

    PYTHONPATH=. python bench/fp4_row_copy.py [--ms 65,96,128,160,256,512,2048]

Per shape and row count: the path the packed weight takes (gemm.pick_path), the copy's (the activations' fold
included) and the fold alone, bf16's F.linear on the dequantized weight, and the copy's relative error against the
fp32 reference.
"""
import argparse
import sys

import torch

from fp4_gemm import make_weight, time_ms

from atomlite.model_ops.triton.mxfp4 import gemm as fp4
from atomlite.model_ops.triton.mxfp4 import row_copy
from atomlite.model_ops.triton.mxfp4.lookup import scale_bytes_fit

SHAPES = [(16384, 5376), (5376, 8192), (43008, 5376), (5376, 21504)]  # N x K: qkv, o, gate_up, down


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="64,65,96,128,160,192,256,384,512,1024,2048")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    print(f"{'N x K':>12} {'M':>5} | {'path':>7} {'copy':>7} {'fold':>6} {'bf16':>7} (us) | bf16/path bf16/copy | "
          f"path, copy's relative error")
    for i, (n, k) in enumerate(SHAPES):
        packed, scale, w_ref = make_weight(n, k, seed=i)
        weight, weight_scale = fp4.pad_to_k_align(packed, scale)
        wide, lookup_ok = fp4.needs_wide_scales(weight_scale), scale_bytes_fit(weight, weight_scale)
        copy = row_copy.make_row_copy(weight, weight_scale)
        w_bf16 = w_ref.to(torch.bfloat16)
        for m in map(int, args.ms.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            expected = fp4.quantize_dequantize(x.float()) @ w_ref.T
            error = ((row_copy.row_copy_gemm(x, copy).float() - expected).norm() / expected.norm()).item()
            t = time_ms({"path": lambda: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, lookup_scales=lookup_ok),
                         "copy": lambda: row_copy.row_copy_gemm(x, copy),
                         "fold": lambda: row_copy.fold_activations(x, weight.shape[1] * 2),
                         "bf16": lambda: torch.nn.functional.linear(x, w_bf16)})
            t = {name: ms * 1e3 for name, ms in t.items()}
            path = type(fp4.pick_path(m, n, x, True, wide, lookup_ok)).__name__
            print(f"{n:>5} x {k:<5} {m:>5} | {t['path']:7.1f} {t['copy']:7.1f} {t['fold']:6.1f} {t['bf16']:7.1f}      | "
                  f"{t['bf16'] / t['path']:9.2f} {t['bf16'] / t['copy']:9.2f} | {path}, {error:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
