"""The LoRA shrink + expand of one projection against the projection's own GEMM, on a GPU, at Gemma-4-31B's decode
shapes: batch 16 spread over 4 rank-16 adapters, each call in a CUDA graph of many (as decode replays them).
bench/lora_tpot.py measures the whole step; this says which projection's LoRA costs what.

    PYTHONPATH=. python bench/lora_kernels.py [--rows 16] [--adapters 4] [--rank 16] [--sweep-expand]

Checks the kernels against the torch reference first. Prints per projection the GEMM's microseconds (the dispatch's
linear for bf16), the shrink's and the expand's, and (shrink + expand) / GEMM.
"""
import argparse

import torch

from atomlite.model_ops.torch_ref import lora as ref
from atomlite.model_ops.triton.gemm.skinny import linear
from atomlite.model_ops.triton.lora import gathered, tuning
from decode_attention import CALLS, graph_us  # bench/ is on the path when a bench script runs

# (projection, fused slice sizes (N), K) of a Gemma-4-31B sliding layer
SHAPES = [("qkv", (8192, 4096, 4096), 5376), ("o", (5376,), 8192), ("gate_up", (21504, 21504), 5376),
          ("down", (5376,), 21504)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--sweep-expand", action="store_true", help="time the expand at other tile widths too")
    args = parser.parse_args()
    slots = torch.arange(args.rows, dtype=torch.int32, device="cuda") % args.adapters
    print(f"{torch.cuda.get_device_name()}: {args.rows} rows over {args.adapters} rank-{args.rank} adapters, "
          f"microseconds per call (CUDA graph of {CALLS})")
    print(f"{'projection':10s} {'N':>6s} {'K':>6s} {'GEMM':>8s} {'shrink':>8s} {'expand':>8s} {'LoRA/GEMM':>10s}")
    for name, sizes, k in SHAPES:
        n = sum(sizes)
        x = torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        a = torch.randn(args.adapters, len(sizes) * args.rank, k, device="cuda", dtype=torch.bfloat16) * 0.02
        b = torch.randn(args.adapters, n, args.rank, device="cuda", dtype=torch.bfloat16) * 0.02
        y = linear(x, w)
        got, want = y.clone(), y.clone()
        gathered.lora_expand(got, gathered.lora_shrink(x, a, slots), b, slots, sizes)
        ref.lora_expand(want, ref.lora_shrink(x, a, slots), b, slots, sizes)
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=2e-3)
        shrunk = gathered.lora_shrink(x, a, slots)
        gemm = graph_us(lambda: linear(x, w))
        shrink = graph_us(lambda: gathered.lora_shrink(x, a, slots))
        expand = graph_us(lambda: gathered.lora_expand(y, shrunk, b, slots, sizes))
        print(f"{name:10s} {n:6d} {k:6d} {gemm:8.1f} {shrink:8.1f} {expand:8.1f} {(shrink + expand) / gemm:9.2f}x")
        if args.sweep_expand:
            sweep_expand(y, shrunk, b, slots, sizes)


def sweep_expand(y, shrunk, b, slots, sizes) -> None:
    """The expand's microseconds at each (columns per program, warps), to retune tuning.EXPAND_*."""
    chosen = (tuning.EXPAND_BLOCK_N, tuning.EXPAND_WARPS)
    times = []
    for block_n, warps in [(128, 4), (256, 4), (256, 8), (512, 4), (512, 8)]:
        tuning.EXPAND_BLOCK_N, tuning.EXPAND_WARPS = block_n, warps
        times.append(f"{block_n}/{warps}: {graph_us(lambda: gathered.lora_expand(y, shrunk, b, slots, sizes)):.1f}")
    tuning.EXPAND_BLOCK_N, tuning.EXPAND_WARPS = chosen
    print(f"{'':10s} expand by columns/warps: {', '.join(times)}")


if __name__ == "__main__":
    main()
