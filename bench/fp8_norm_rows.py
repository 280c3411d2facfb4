"""The residual update's next norm written quantized per token (TokenRows, one launch) against the residual update
followed by quant.quantize_rows (two launches), at 31B's and 26B-A4B's hidden sizes and decode-batch to prefill row
counts: microseconds per call in a CUDA graph, and how many quantized values the two ways give differently. On an H200
that count was small but not zero from 128 rows of 5376: the residual sums of the two compiled variants of the kernel
differed there too, so they round a norm differently (likely their own order of summing a row's squares).

    PYTHONPATH=. python bench/fp8_norm_rows.py [--rows 1,16,64,128,256,512,1024,2048]
"""
import argparse

import torch

from atomlite.model_ops.carriers import TokenQuantization
from atomlite.model_ops.triton.fp8 import quant
from atomlite.model_ops.triton.norm.residual import rms_norm_residual
from decode_attention import graph_us  # bench/ is on the path when a bench script runs

HIDDEN = [("31B", 5376), ("26B-A4B", 2816)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16,64,128,256,512,1024,2048")
    row_counts = [int(r) for r in parser.parse_args().rows.split(",")]
    fp8 = torch.float8_e4m3fn
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    for name, dim in HIDDEN:
        weight, next_weight = (1 + 0.1 * torch.randn(2, dim, device="cuda")).to(torch.bfloat16)
        for rows in row_counts:
            x, residual = torch.randn(2, rows, dim, device="cuda", dtype=torch.bfloat16)

            def fused():
                return rms_norm_residual(x, residual, weight, 1e-6, next_weight=next_weight,
                                         quantize=TokenQuantization(fp8))

            def apart():
                _, normed = rms_norm_residual(x, residual, weight, 1e-6, next_weight=next_weight)
                return quant.quantize_rows(normed, "token", fp8)

            rows_q = fused()[1]
            q, s = apart()
            differ = (rows_q.values.float() * rows_q.scales != q.float() * s).sum().item()
            one, two = graph_us(fused), graph_us(apart)
            print(f"{name} {dim} wide, {rows} rows: one launch {one:.1f} us, residual update + quantize_rows "
                  f"{two:.1f} us ({one / two:.2f}x); {differ} of {q.numel()} values differ", flush=True)


if __name__ == "__main__":
    main()
