"""The MoE router at decode: the one-launch kernel (logits GEMM split over K, the last program picks each token's
top-k) against the GEMM and router_topk apart, at 26B-A4B's shape, per batch size. Each call is captured 20 times
in a CUDA graph (no host launch cost, as decode graphs run it) with L2 emptied before each call.

    PYTHONPATH=. python bench/router.py [--batches 1,2,4,8,16]
"""
import argparse
import importlib

import torch

from atomlite.model_ops.triton.moe.router import router, router_topk
from atomlite.model_ops.triton.gemm.skinny import linear
from decode_attention import FLUSH_BYTES, cold_us

EXPERTS, HIDDEN, TOP_K = 128, 2816, 8


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,2,4,8,16")
    args = parser.parse_args()
    # router() runs one launch up to MAX_ROWS tokens only (the limit these numbers set): lift it to time the kernel
    router_module = importlib.import_module("atomlite.model_ops.triton.moe.router")
    router_module.MAX_ROWS = max(int(b) for b in args.batches.split(","))
    print(f"device: {torch.cuda.get_device_name()}; router {EXPERTS} x {HIDDEN}, top {TOP_K}")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda").zero_
    weight = torch.randn(EXPERTS, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    scale = torch.rand(EXPERTS, device="cuda", dtype=torch.bfloat16) + 0.5
    for rows in (int(b) for b in args.batches.split(",")):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        fused = cold_us(lambda: router(x, weight, scale, TOP_K), flush)
        apart = cold_us(lambda: router_topk(linear(x, weight), scale, TOP_K), flush)
        print(f"batch {rows:2d}: one launch {fused:5.1f} us, GEMM + sum + top-k {apart:5.1f} us", flush=True)


if __name__ == "__main__":
    main()
