"""FP8 activation quantization per token (quant.quantize_rows) of decode and prefill rows, at Gemma-4 shapes: each
way a row may be read (one pass: one program holding the whole row, or, with fewer rows than multiprocessors, the
row's chunks over several programs that each read the whole row for its amax (quant.row_chunk); one program looping
over it LOOPED_BLOCK at a time, twice; or the split amax: the chunks' amaxes first, then the values), timed in a
CUDA graph against its bytes at the probed copy rate; every way is first checked bit for bit against the one-pass
way. quant.loops_over_rows and quant.splits_amax pick the way.

    PYTHONPATH=. python bench/fp8_quantize_rows.py [--rows 512,2048]

Shapes: o_proj's input (31B 8192, 26B-A4B 4096 wide), the down projection's gated input [gate | up] (31B 21504,
26B-A4B 2112 wide each, its experts' 704, a row per token and expert) and the hidden width (31B 5376, 26B-A4B 2816:
the experts' input). Each cell: microseconds per call, and that over the bytes (x read once, the fp8 rows written)
at the copy rate; a gated input also through the activation kernel and then quantized, as where
quant.quantizes_gated_cheaply does not take the gated way.
"""
import argparse

import torch

from atomlite.benchmarks.roofline import probe
from atomlite.model_ops.triton.activation import gelu_tanh_and_mul
from atomlite.model_ops.triton.fp8 import quant
from decode_attention import graph_us  # bench/ is on the path when a bench script runs

SHAPES = [("31B o input", 8192, False), ("31B down input (gated)", 21504, True), ("31B hidden", 5376, False),
          ("26B-A4B o input", 4096, False), ("26B-A4B dense down input (gated)", 2112, True),
          ("26B-A4B hidden (the experts' input)", 2816, False),
          ("26B-A4B experts' down input (gated)", 704, True)]
CHOSEN = (quant.loops_over_rows, quant.LOOPED_BLOCK, quant.LOOPED_WARPS, quant.SPLIT_AMAX_FEW_ROWS,
          quant.SPLIT_AMAX_WIDE, quant.SPLIT_AMAX_VERY_WIDE)
SPLIT = -1  # a way's block: the chunk amaxes first, then the values (quant.SPLIT_AMAX), at every row count
WAYS = [("one pass", 0, 4), ("looped 1024 / 4 warps", 1024, 4), ("looped 2048 / 4 warps", 2048, 4),
        ("looped 2048 / 8 warps", 2048, 8), ("looped 4096 / 8 warps", 4096, 8), ("split amax", SPLIT, 0)]


def way(block: int, warps: int) -> None:
    """block 0: one pass (no row is looped or split); SPLIT: the split amax for any rows."""
    if block > 0:
        quant.LOOPED_BLOCK, quant.LOOPED_WARPS = block, warps
    quant.loops_over_rows = lambda rows, k: block > 0
    split = block == SPLIT
    quant.SPLIT_AMAX_FEW_ROWS, quant.SPLIT_AMAX_WIDE = (1 << 30, 0) if split else (0, 1 << 30)
    quant.SPLIT_AMAX_VERY_WIDE = 1 << 30


def chosen_way() -> None:
    """The way quant's own rules pick."""
    (quant.loops_over_rows, quant.LOOPED_BLOCK, quant.LOOPED_WARPS, quant.SPLIT_AMAX_FEW_ROWS, quant.SPLIT_AMAX_WIDE,
     quant.SPLIT_AMAX_VERY_WIDE) = CHOSEN


def quantized(x: torch.Tensor, gated: bool, block: int, warps: int):
    way(block, warps)
    return quant.quantize_rows(x, "token", torch.float8_e4m3fn, gated=gated)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="512,2048")
    row_counts = [int(r) for r in parser.parse_args().rows.split(",")]
    copy_rate = probe(torch.device("cuda"), torch.bfloat16).copy_bytes_per_s
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}; copy {copy_rate / 1e12:.2f} TB/s")
    for name, k, gated in SHAPES:
        for rows in row_counts:
            x = torch.randn(rows, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
            ideal_us = (x.numel() * 2 + rows * k) / copy_rate * 1e6
            want_q, want_s = quantized(x, gated, 0, 4)
            cells = []
            for label, block, warps in WAYS:
                q, s = quantized(x, gated, block, warps)
                if not (torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)):
                    cells.append(f"{label}: differs from the one-pass way")
                    continue
                way(block, warps)
                us = graph_us(lambda: quant.quantize_rows(x, "token", torch.float8_e4m3fn, gated=gated))
                cells.append(f"{label}: {us:.1f} ({us / ideal_us:.2f}x)")
            if gated:
                cells.append(apart_cell(x, k, want_q, want_s))
            print(f"{name}, {rows} rows ({ideal_us:.1f} us at the copy rate): " + "; ".join(cells), flush=True)


def apart_cell(x: torch.Tensor, k: int, want_q: torch.Tensor, want_s: torch.Tensor) -> str:
    """[gate | up] through the activation kernel, then quantized the way the rules pick, against the same bits;
    and whether quant.quantizes_gated_cheaply takes the gated way instead at this shape."""
    chosen_way()

    def apart():
        return quant.quantize_rows(gelu_tanh_and_mul(x), "token", torch.float8_e4m3fn)
    q, s = apart()
    takes = quant.quantizes_gated_cheaply(x.shape[0], k, "token", x.device)
    if not (torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)):
        return "activation kernel, then quantized: differs from the gated way"
    return f"activation kernel, then quantized: {graph_us(apart):.1f} (the rules take {'gated' if takes else 'this'})"


if __name__ == "__main__":
    main()
