"""The lookup kernel (fp8 MMAs on weights expanded in registers, mxfp4/lookup.py) at decode batches of 128-512 rows,
where pick_path now takes cuBLAS's block-scaled fp8 GEMM on e4m3 weight slabs: each lookup tile config against
that path and against bf16 on the dequantized weight, at Gemma-4-31B shapes, in the same run (bench/fp4_gemm.py's
timing: CUDA graphs, L2 flushed, best of 3 rounds). Every config is checked against the torch reference first.

    PYTHONPATH=. python bench/fp4_lookup_rows.py [--ms 64,128,256,512]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp4_gemm import SHAPES, describe, fp4, lookup, make_weight, relative_error, time_ms  # noqa: E402

from atomlite.quant import mxfp4  # noqa: E402

L = lookup.LookupConfig
CONFIGS = [L(64, 64, 4, 3), L(128, 64, 4, 3), L(128, 64, 4, 2), L(256, 64, 4, 2), L(64, 128, 8, 3),
           L(128, 128, 8, 3), L(128, 128, 8, 2), L(256, 128, 8, 2)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="64,128,256,512")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    failures = []
    for i, (n, k) in enumerate(SHAPES):
        packed, scale, w_ref = make_weight(n, k, seed=i)
        assert lookup.scale_bytes_fit(packed, scale)
        weight, weight_scale = fp4.pad_to_k_align(packed, scale)
        wide = fp4.needs_wide_scales(scale)
        x = torch.randn(200, k, device="cuda").to(torch.bfloat16)
        expected = mxfp4.quantize_dequantize(x.float()) @ w_ref.T
        for config in CONFIGS:
            try:
                got = fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, config, lookup_scales=True)
                err = relative_error(got, expected)
            except Exception as error:  # a tile that does not fit this GPU: reported, not timed
                failures.append(f"{n}x{k} {describe(config)}: {type(error).__name__}: {str(error)[:200]}")
                continue
            if not err < 4e-3:
                failures.append(f"{n}x{k} {describe(config)}: relative error {err:.2e}")
        bad = {f.split(":")[0] for f in failures}
        configs = [c for c in CONFIGS if f"{n}x{k} {describe(c)}" not in bad]
        w_bf16 = w_ref.to(torch.bfloat16)
        for m in map(int, args.ms.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            fns = {"bf16": lambda: torch.nn.functional.linear(x, w_bf16),
                   "path": lambda: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, lookup_scales=True)}
            fns.update({c: lambda c=c: fp4.mxfp4_gemm(x, weight, weight_scale, True, wide, c, lookup_scales=True)
                        for c in configs})
            times = time_ms(fns)
            path = describe(fp4.pick_path(m, n, x, True, wide, True))
            print(f"{n}x{k} M={m}: bf16 {times['bf16'] * 1e3:.1f} us, today's path {times['path'] * 1e3:.1f} us "
                  f"({times['bf16'] / times['path']:.2f}x; {path})", flush=True)
            for c in configs:
                print(f"    {describe(c):28s} {times[c] * 1e3:7.1f} us  {times['bf16'] / times[c]:.2f}x of bf16",
                      flush=True)
    print("check vs torch reference:", "FAILED\n  " + "\n  ".join(failures) if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
