"""FP8 GEMM (Triton, the checkpoint's activation quantization fused in) vs torch bf16 GEMM, on the GPU, at
Gemma-4-31B shapes, for each semantics atomlite runs (FP8-Dynamic, FP8-block, Quark fp8 static, weight-only).

Checks the kernel against the torch reference (quant.fp8) first, then times both in the same run (CUDA events after
warm-up, median of many, L2 flushed between calls) and prints speedup = bf16 time / fp8 time.

    PYTHONPATH=. python bench/fp8_gemm.py [--ms 1,16,256,2048]
"""
import argparse

import torch

from atomlite.model_ops.triton.fp8.family import FP8_LINEAR
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec

SHAPES = [(21504 * 2, 5376), (5376, 21504), (8192, 5376)]  # N x K: gate_up, down, qkv-sized
MS = [1, 2, 16, 64, 256, 2048]
SPECS = {"dynamic": FP8Spec("channel", "token"), "block": FP8Spec("block", "group"),
         "static": FP8Spec("tensor", "static"), "w8a16": FP8Spec("channel", None)}


def median_ms(fn, flush: torch.Tensor, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def layer(spec: FP8Spec, n: int, k: int):
    w = torch.randn(n, k, device="cuda") * 0.02
    q, stored = fp8.quantize_weight(w, spec)
    scale = (fp8.expand_block_scales(stored, n, k, spec.block) if spec.weight == "block"
             else stored.float().reshape(-1, 1).expand(n, 1))
    q, scale, _ = FP8_LINEAR.prepare_weights(q, scale.contiguous(), spec)
    input_scale = torch.tensor([0.02], device="cuda") if spec.static_input else None
    return q, scale, input_scale, w.to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    ms = [int(m) for m in parser.parse_args().ms.split(",")]
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'semantics':>9} {'N x K':>13} {'M':>5} {'bf16 ms':>9} {'fp8 ms':>9} {'speedup':>8}")
    for name, spec in SPECS.items():
        for n, k in SHAPES:
            q, scale, input_scale, w_bf16 = layer(spec, n, k)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                got = FP8_LINEAR.matmul(x, q, scale, input_scale, None, spec).float()
                want = fp8.gemm(x.float(), q, scale, spec, input_scale)  # fnuz weights (gfx942) dequantize alike
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
                fp8_ms = median_ms(lambda: FP8_LINEAR.matmul(x, q, scale, input_scale, None, spec), flush)
                bf16_ms = median_ms(lambda: x @ w_bf16.T, flush)
                print(f"{name:>9} {f'{n}x{k}':>13} {m:>5} {bf16_ms:9.4f} {fp8_ms:9.4f} {bf16_ms / fp8_ms:8.2f}")


if __name__ == "__main__":
    main()
