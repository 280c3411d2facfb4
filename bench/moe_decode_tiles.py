"""26B-A4B's batch-1 TPOT for several few-pairs expert tiles (moe/tuning.GEMV_BF16's gate_up), end to end.

Alone the gate_up kernel is timed by bench/moe_layer.py --kernels; in a decode step it runs beside the dense MLP's
GEMMs on the other stream, and the tile's registers decide whether those GEMMs find room on the multiprocessors
beside it (a 26B-A4B timeline showed the dense gate_up waiting for the experts' kernel in some layers and running
beside it in others). So each tile is timed in a whole decode step: an engine of its own per tile (a subprocess),
dummy weights, graphs, the median step of --output-len tokens at batch 1, after the tile is checked against the
torch reference on one layer's shapes.

    PYTHONPATH=. python bench/moe_decode_tiles.py [--tiles 16x256x4,16x128x4] [--input-len 512]
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from atomlite.model_ops.triton.moe import gemv  # noqa: E402
from atomlite.model_ops.triton.moe.tuning import GEMV_BF16, GemvConfig, GemvTiles  # noqa: E402

MODEL = "examples/configs/gemma-4-26B-A4B-it"


def parse_tile(text: str) -> GemvTiles:
    block_n, block_k, warps = (int(v) for v in text.split("x"))
    return GemvTiles(block_n, block_k, warps)


def check(config: GemvConfig, hidden: int = 2816, inner: int = 704, experts: int = 128) -> float:
    """The tile's experts at one token against the torch reference: relative error."""
    from atomlite.model_ops.torch_ref.moe import moe_experts as reference
    from atomlite.model_ops.triton.moe.common import ExpertWeights
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(experts, 2 * inner, hidden, device="cuda", generator=g).bfloat16() * hidden ** -0.5
    down = torch.randn(experts, hidden, inner, device="cuda", generator=g).bfloat16() * inner ** -0.5
    x = torch.randn(1, hidden, device="cuda", generator=g).bfloat16()
    ids = torch.randperm(experts, device="cuda", generator=g)[:8].reshape(1, 8)
    weights = torch.rand(1, 8, device="cuda", generator=g)
    got = gemv.gemv_experts(x, ExpertWeights(gate_up), ExpertWeights(down), weights, ids, quantize_x=False,
                            config=config).float()
    want = reference(x.float(), gate_up.float(), down.float(), weights, ids)
    return ((got - want).norm() / want.norm()).item()


def one(tile: GemvTiles, args) -> None:
    from atomlite import LLM
    from atomlite.benchmarks.offline import decode_step_times, random_prompts, warm_up
    gemv.GEMV_BF16 = GemvConfig(tile, GEMV_BF16.down)  # what bf16_config hands the layers from here on
    config = gemv.bf16_config(704)
    assert config.gate_up == tile
    error = check(config)
    torch.cuda.empty_cache()  # the check's weights, before the engine sizes its KV cache
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=1, max_model_len=2048)
    engine = llm.engine
    warm_up(engine, 1, args.input_len, seed=0)
    steps = decode_step_times(engine, random_prompts(engine, 1, args.input_len, seed=1), args.output_len, None)
    name = f"{tile.block_n}x{tile.block_k}x{tile.num_warps}"
    print(f"RESULT gate_up tile {name}: TPOT {statistics.median(steps) * 1e3:.3f} ms (relative error against the "
          f"reference {error:.1e})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=MODEL)
    p.add_argument("--tiles", default="16x256x4,16x128x4,16x64x4,32x64x4")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one(parse_tile(args.one), args)
        return
    for text in args.tiles.split(","):
        command = [sys.executable, __file__, "--one", text, "--model", args.model, "--input-len", str(args.input_len),
                   "--output-len", str(args.output_len)]
        out = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
        print(lines[0] if lines else f"{text}: failed\n{out.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
