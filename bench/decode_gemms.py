"""The decode GEMMs of a model at batch M (bf16, torch F.linear = cuBLAS / hipBLASLt) against reading the same
weight bytes with a device copy, same GPU, same run: how far the weight stream is from the copy bandwidth.

    PYTHONPATH=. python bench/decode_gemms.py --model examples/configs/gemma-4-31B-it [--ms 1,16]

Shapes come from the model built on the meta device (every Linear once, with how many layers have it).
"""
import argparse
from collections import Counter

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from atomlite.config import EngineConfig
from atomlite.model_ops.platform import Platform
from atomlite.plan import meta_model


def linear_shapes(model_dir: str) -> Counter:
    model = meta_model(EngineConfig(model=model_dir, dtype="bfloat16"), Platform())
    shapes = Counter((m.out_features, m.in_features) for m in model.modules()
                     if hasattr(m, "in_features") and hasattr(m, "out_features"))
    hf = model.spec.hf
    shapes[(hf["vocab_size"], hf["hidden_size"])] += 1  # tied lm_head
    return shapes


def time_us(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--ms", default="1,16")
    args = p.parse_args()
    shapes = linear_shapes(args.model)
    print(f"device: {torch.cuda.get_device_name()}")
    for m in map(int, args.ms.split(",")):
        total_gemm = total_copy = 0.0
        print(f"\nM = {m}: {'N x K':>16} {'layers':>6} {'GEMM us':>9} {'TB/s':>6} {'copy us':>8} {'ratio':>6}")
        for (n, k), count in sorted(shapes.items()):
            # several weight copies in rotation, so no call finds its weight in L2
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            src = torch.empty(n * k // 2, device="cuda", dtype=torch.bfloat16).normal_()
            dst = torch.empty_like(src)
            state = {"i": 0}

            def gemm():
                state["i"] = (state["i"] + 1) % 3
                return F.linear(x, weights[state["i"]])
            g, c = time_us(gemm), time_us(lambda: dst.copy_(src))  # copy: read + write the weight's bytes
            total_gemm += g * count
            total_copy += c * count
            print(f"{'':8} {n:>7} x {k:<7} {count:6} {g:9.1f} {n * k * 2 / g / 1e6:6.2f} {c:8.1f} {g / c:6.2f}")
            del weights, src, dst
        print(f"{'':8} whole step: GEMMs {total_gemm / 1e3:.2f} ms, copies of the same bytes "
              f"{total_copy / 1e3:.2f} ms, ratio {total_gemm / total_copy:.2f}")


if __name__ == "__main__":
    main()
