"""FP8 experts at decode, at Gemma-4-26B-A4B's shapes (128 experts, hidden 2816, inner 704, top 8), 1 and 4 tokens:
each grouped projection (one pair per block, moe.PairLayout) timed as a decode step replays it, against the weight
bytes it reads at the probed copy rate, at each pair-block tile: what to set in fp8/tuning.py (moe_tile_config).

    PYTHONPATH=. python bench/fp8_experts_decode.py [--tokens 1,4]

Per-token FP8-Dynamic semantics, as model calls run it: the projection's own quantization of x (a few rows) is part
of each call. Each call routes to other experts (ROUTINGS random routings rotated over 128 experts, 507 MB of
gate_up weights: a call's experts are rarely still in L2). Each cell: microseconds per call, and that over the
weight bytes at the probed copy rate (1.00x: the copy rate; a copy reads and writes, so a pure read could go a little
faster). Every tile is checked against quant.fp8's reference first; a tile that does not compile or does not match
prints why.
"""
import argparse

import torch

from atomlite.benchmarks.roofline import probe
from atomlite.model_ops.triton.fp8 import moe, tuning
from atomlite.model_ops.triton.fp8.family import FP8_EXPERTS
from atomlite.quant import fp8
from atomlite.quant.fp8 import FP8Spec
from decode_attention import graph_us  # bench/ is on the path when a bench script runs
from fp8_decode_sweep import rotating

EXPERTS, HIDDEN, INNER, TOP_K = 128, 2816, 704, 8
ROUTINGS = 16
SPEC = FP8Spec("channel", "token")
# (BLOCK_N, BLOCK_K, num_warps, num_stages) at BLOCK_M 16; the first is tuning.moe_tile_config's choice
TILES = [(64, 128, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (64, 256, 4, 3), (128, 128, 4, 3), (16, 256, 4, 3)]


def experts(rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random per-channel FP8 weights [EXPERTS, rows, k] and their scales [EXPERTS, rows, 1], one expert at a time."""
    weights, scales = [], []
    for _ in range(EXPERTS):
        q, stored = fp8.quantize_weight(torch.randn(rows, k, device="cuda") * 0.02, SPEC)
        weights.append(q)
        scales.append(stored.float().reshape(rows, 1))
    return torch.stack(weights), torch.stack(scales)


def routings(tokens: int) -> list[torch.Tensor]:
    """ROUTINGS top-k choices [tokens, TOP_K] (distinct experts per token), spread over every expert."""
    gen = torch.Generator().manual_seed(0)
    return [torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)]).cuda()
            for _ in range(ROUTINGS)]


def projection(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, topk_ids: torch.Tensor,
               rows_per_source: int) -> torch.Tensor:
    layout = moe.PairLayout.of(topk_ids, EXPERTS)
    return moe.fp8_moe_gemm(x, weight, scale, None, layout, rows_per_source, SPEC.activation, SPEC.group_size, 0)


def check(x: torch.Tensor, weight, scale, raw, topk_ids: torch.Tensor, rows_per_source: int) -> None:
    got = projection(x, weight, scale, topk_ids, rows_per_source).float()
    q, s = raw
    for pair, expert in enumerate(topk_ids.flatten().tolist()):
        want = fp8.gemm(x[pair // rows_per_source][None].float(), q[expert], s[expert], SPEC, None)
        torch.testing.assert_close(got[pair:pair + 1], want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def tile_config(block_n: int, block_k: int, warps: int, stages: int):
    return lambda block_m, device, fp32_dot: tuning.FP8TileConfig(block_m, block_n, block_k, warps, stages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,4")
    token_counts = [int(t) for t in parser.parse_args().tokens.split(",")]
    copy_rate = probe(torch.device("cuda"), torch.bfloat16).copy_bytes_per_s
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}; copy {copy_rate / 1e12:.2f} TB/s; "
          "tiles: BLOCK_N/BLOCK_K/warps/stages")
    shapes = {"gate_up": (2 * INNER, HIDDEN), "down": (HIDDEN, INNER)}
    chosen = moe.moe_tile_config
    for name, (n, k) in shapes.items():
        raw = experts(n, k)
        weight, scale, *_ = FP8_EXPERTS.prepare_weights(raw[0], raw[1], raw[0], raw[1], SPEC)
        for tokens in token_counts:
            routes = routings(tokens)
            rows_per_source = TOP_K if name == "gate_up" else 1
            x = torch.randn(tokens * TOP_K // rows_per_source, k, device="cuda", dtype=torch.bfloat16)
            pairs = tokens * TOP_K
            ideal_us = pairs * n * k / copy_rate * 1e6
            cells = []
            for block_n, block_k, warps, stages in TILES:
                moe.moe_tile_config = tile_config(block_n, block_k, warps, stages)
                label = f"{block_n}/{block_k}/{warps}/{stages}"
                try:
                    check(x, weight, scale, raw, routes[0], rows_per_source)
                    us = graph_us(rotating([lambda ids=ids: projection(x, weight, scale, ids, rows_per_source)
                                            for ids in routes]))
                    cells.append(f"{label}: {us:.1f} ({us / ideal_us:.2f}x)")
                except Exception as error:  # a tile Triton cannot build here, or a wrong result: say which
                    cells.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:80]}")
                finally:
                    moe.moe_tile_config = chosen
            print(f"{name} N={n} K={k}, {tokens} token(s) ({pairs} pairs, {pairs * n * k / 1e6:.1f} MB, "
                  f"{ideal_us:.1f} us at the copy rate):")
            for cell in cells:
                print(f"  {cell}")
        del raw, weight, scale


if __name__ == "__main__":
    main()
