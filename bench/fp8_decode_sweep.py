"""FP8 decode GEMMs at Gemma-4-31B's shapes, 1 and 16 rows, against the bf16 skinny GEMM in the same run, each way
the FP8 path can be launched and at each decode tile: what to set in fp8/tuning.py (DECODE, DECODE_K_BLOCKS and
DECODE_K_BLOCKS_WIDE).

    PYTHONPATH=. python bench/fp8_decode_sweep.py [--ms 1,16] [--top 6]

Ways, each timed as a decode step replays it (a CUDA graph of many calls, weights rotated through copies larger
than L2 together):
  block/before    quantize_rows per group of 128 (one launch), then the GEMM on fp8 x with per-group scales
  dynamic/before  quantize_rows per token, then the GEMM (fp8_gemm's FP8-Dynamic way); /gemm: the GEMM alone
  static/before   quantize_rows with a static input scale, then the GEMM on a per-tensor W (Quark's fp8)
Each line: the fastest tiles, microseconds per call, and that over the bf16 skinny GEMM's (the bytes halve: 0.5 is
the ideal); the chosen tile (fp8/tuning.py) is marked *. Every way is checked against quant.fp8's reference first.
"""
import argparse

import torch

from atomlite.model_ops.triton.fp8 import gemm, tuning
from atomlite.model_ops.triton.fp8.quant import quantize_rows
from atomlite.model_ops.triton.gemm.skinny import linear
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec
from decode_attention import graph_us  # bench/ is on the path when a bench script runs
from fp8_gemm import layer

SHAPES = [("qkv", 16384, 5376), ("o", 5376, 8192), ("gate_up", 43008, 5376), ("down", 5376, 21504)]
L2_BYTES = 3 * (50 << 20)  # weights rotated through copies of at least this many bytes together
STATIC_INPUT_SCALE = 0.02  # the static way's calibrated input scale
# (BLOCK_N, BLOCK_K, num_warps, num_stages, programs_per_sm, TMA) at BLOCK_M 16, split-K on; the block semantics
# take BLOCK_K 128 only (one scale block a step); TMA tiles are at most 256 wide
TILES = [(128, 128, 4, 3, 2, False), (64, 128, 4, 4, 4, False), (64, 256, 4, 3, 2, False), (64, 256, 4, 4, 2, False),
         (64, 512, 4, 3, 2, False), (128, 256, 8, 3, 2, False), (64, 256, 4, 3, 2, True), (128, 256, 4, 3, 2, True),
         (128, 256, 4, 4, 2, True), (128, 256, 8, 3, 2, True), (128, 256, 4, 3, 3, True), (128, 256, 4, 3, 4, True),
         (128, 128, 4, 4, 2, True), (128, 128, 4, 3, 3, True), (64, 128, 4, 4, 4, True), (256, 128, 8, 3, 2, True)]


def copies(n: int, k: int, element_bytes: int) -> int:
    return max(1, -(-L2_BYTES // (n * k * element_bytes)))


def rotating(fns: list):
    """One callable that runs the next of fns each call (a graph records the rotation)."""
    state = {"i": 0}

    def call():
        fns[state["i"] % len(fns)]()
        state["i"] += 1
    return call


def fp8_layers(spec: FP8Spec, n: int, k: int, count: int):
    q, scale, _, _ = layer(spec, n, k)
    return [(q.clone(), scale.clone()) for _ in range(count)]


def ways(x: torch.Tensor, spec_name: str):
    """name -> fn(q, scale) for the FP8 semantics."""
    if spec_name == "static":
        input_scale = torch.tensor([STATIC_INPUT_SCALE], device=x.device)

        def static(q, scale):
            xq, xs = quantize_rows(x, "static", q.dtype, 128, input_scale)
            return gemm.scaled_mm(xq, xs, q, scale, 0, x.dtype)
        return {"before": static}
    if spec_name == "block":
        def before(q, scale):
            xq, xs = quantize_rows(x, "group", q.dtype, 128)
            return gemm.scaled_mm(xq, xs, q, scale, 128, x.dtype)
        return {"before": before}
    xq_fixed, xs_fixed = quantize_rows(x, "token", torch.float8_e4m3fn, 128)

    def before(q, scale):
        xq, xs = quantize_rows(x, "token", q.dtype, 128)
        return gemm.scaled_mm(xq, xs, q, scale, 0, x.dtype)
    return {"before": before, "gemm": lambda q, scale: gemm.scaled_mm(xq_fixed, xs_fixed, q, scale, 0, x.dtype)}


def check(fn, x, layer, spec) -> None:
    q, scale = layer
    got = fn(q, scale).float()
    input_scale = torch.tensor([STATIC_INPUT_SCALE], device=x.device) if spec.static_input else None
    want = fp8.gemm(x.float(), q, scale, spec, input_scale)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def chosen_tile(m: int, n: int, spec: FP8Spec) -> tuning.FP8TileConfig:
    return tuning.tile_config(m, torch.device("cuda"), False, k_blocks=spec.weight == "block", n=n)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="1,16")
    parser.add_argument("--top", type=int, default=6, help="the fastest tiles printed per way")
    args = parser.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    specs = {"block": FP8Spec("block", "group"), "dynamic": FP8Spec("channel", "token"),
             "static": FP8Spec("tensor", "static")}
    saved = tuning.DECODE, tuning.DECODE_K_BLOCKS, tuning.DECODE_K_BLOCKS_WIDE
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}; "
          "tiles: BLOCK_N/BLOCK_K/warps/stages/programs per SM/TMA or pointers")
    for name, n, k in SHAPES:
        w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies(n, k, 2))]
        layers = {s: fp8_layers(spec, n, k, copies(n, k, 1)) for s, spec in specs.items()}
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bf16 = graph_us(rotating([lambda w=w: linear(x, w) for w in w16]))
            print(f"{name} N={n} K={k} M={m}: bf16 skinny {bf16:.1f} us")
            for spec_name, spec in specs.items():
                chosen = chosen_tile(m, n, spec)
                for way, fn in ways(x, spec_name).items():
                    cells = []
                    for block_n, block_k, warps, stages, per_sm, tma in TILES:
                        if spec_name == "block" and block_k != 128:
                            continue
                        tile = tuning.FP8TileConfig(16, block_n, block_k, warps, stages, split_k=True,
                                                    programs_per_sm=per_sm, tma=tma)
                        tuning.DECODE = tuning.DECODE_K_BLOCKS = tuning.DECODE_K_BLOCKS_WIDE = tile
                        check(fn, x, layers[spec_name][0], spec)
                        us = graph_us(rotating([lambda layer=layer: fn(*layer) for layer in layers[spec_name]]))
                        mark = "*" if tile == chosen else ""
                        cells.append((us, f"{mark}{block_n}/{block_k}/{warps}/{stages}/{per_sm}/"
                                          f"{'tma' if tma else 'ptr'}: {us:.1f} ({us / bf16:.2f})"))
                    tuning.DECODE, tuning.DECODE_K_BLOCKS, tuning.DECODE_K_BLOCKS_WIDE = saved
                    best = [cell for _, cell in sorted(cells)[:args.top]]
                    chosen_cells = [cell for _, cell in cells if cell.startswith("*") and cell not in best]
                    print(f"  {spec_name}/{way:7s} " + ", ".join(best + chosen_cells))
            del x


if __name__ == "__main__":
    main()
