"""One MoE layer of Gemma-4-26B-A4B (shapes from examples/configs), random weights, one GPU, same run: today's
per-expert loop (torch_ref.moe_experts), the fused bf16 kernels and the fused MXFP4 kernels (dynamic FP4 inputs,
as Quark's W4A4 export runs). Each path is first checked against the fp32 reference, eagerly and replayed from a
CUDA graph; then each is timed at every batch size:
- eager: CUDA events around one call after an L2 flush (launches included), median of EAGER_REPEATS after warmup;
  the loop syncs with the host, so eager is the only way it runs;
- graph: the fused paths replayed from a CUDA graph (bench/fp4_gemm.py graph_ms: L2 flushed before every call), as
  decode graphs run them.
Ratios are the loop's eager time over each fused time; "roofline" is the expert weight bytes the batch must read
(its distinct experts) over the measured copy bandwidth.

    PYTHONPATH=. python bench/moe_layer.py [--batches 1,32,512] [--sweep] [--projections] [--tails] [--kernels] [-tp 2]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp4_gemm import graph_ms, replayed  # noqa: E402  (bench/ is this script's folder)

from atomlite.config import load_model_spec  # noqa: E402
from atomlite.model_ops import torch_ref  # noqa: E402
from atomlite.model_ops.triton.moe import gemm as moe_gemm  # noqa: E402
from atomlite.model_ops.triton.moe import gemv as moe_gemv
from atomlite.model_ops.triton.moe import gemv_fp8 as moe_gemv_fp8
from atomlite.model_ops.triton.moe.gemm import ExpertWeights, MoeConfig, ProjectionTiles  # noqa: E402
from atomlite.model_ops.triton.moe.routing import group_by_expert  # noqa: E402
from atomlite.model_ops.triton.moe.gemv import GemvConfig, GemvTiles  # noqa: E402
from atomlite.model_ops.triton.mxfp4.gemm import needs_wide_scales, pad_to_k_align  # noqa: E402
from atomlite.quant import mxfp4  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "gemma-4-26B-A4B-it"
EAGER_REPEATS, WARMUP = 30, 5
MAX_RELATIVE_ERROR = 1e-2
T = ProjectionTiles
SWEEP = [MoeConfig(16, T(32, 128, 4, 3), T(64, 64, 4, 3)), MoeConfig(16, T(64, 128, 4, 3), T(64, 64, 4, 3)),
         MoeConfig(16, T(32, 256, 4, 3), T(32, 128, 4, 3)), MoeConfig(16, T(32, 64, 4, 4), T(64, 128, 4, 3)),
         MoeConfig(32, T(64, 64, 4, 3), T(64, 64, 4, 3)), MoeConfig(32, T(64, 128, 8, 3), T(128, 64, 8, 3)),
         MoeConfig(64, T(64, 64, 8, 3), T(128, 64, 8, 3)), MoeConfig(64, T(128, 64, 8, 3), T(128, 64, 8, 4)),
         MoeConfig(128, T(64, 64, 8, 3), T(128, 64, 8, 3)), MoeConfig(128, T(128, 64, 8, 3), T(128, 64, 8, 3)),
         MoeConfig(64, T(128, 64, 4, 4), T(128, 64, 4, 4)), MoeConfig(128, T(128, 64, 8, 4), T(128, 64, 8, 4)),
         MoeConfig(64, T(256, 64, 8, 3), T(256, 64, 8, 3)), MoeConfig(128, T(256, 64, 8, 3), T(128, 64, 8, 3))]
PROJECTION_SWEEP = {
    "gate_up": [T(n, k, w, st) for n in (64, 128, 256) for k, stages in ((64, (3, 4)), (128, (2, 3)))
                for w in (4, 8) for st in stages],
    "down": [T(n, k, w, st) for n in (64, 128, 256) for k, stages in ((64, (3, 4)), (128, (2, 3)))
             for w in (4, 8) for st in stages],
}
G = GemvTiles
GEMV_SWEEP = [GemvConfig(G(16, 256, 4), G(32, 64, 4)), GemvConfig(G(16, 256, 4), G(32, 128, 4)),
              GemvConfig(G(8, 256, 4), G(16, 128, 4)), GemvConfig(G(16, 128, 4), G(16, 128, 4)),
              GemvConfig(G(32, 256, 8), G(32, 128, 4)), GemvConfig(G(16, 256, 8), G(64, 128, 8)),
              GemvConfig(G(8, 256, 4), G(32, 256, 8)), GemvConfig(G(4, 256, 2), G(8, 128, 2))]
F = moe_gemv_fp8.Fp8GemvConfig
FP8_GEMV_SWEEP = [F(64, 64), F(64, 64, gate_up_splits=1), F(64, 64, gate_up_splits=2), F(64, 64, gate_up_splits=3),
                  F(64, 64, 4, 2), F(64, 128), F(128, 64), F(64, 64, 4), F(64, 64, 2), F(128, 64, gate_up_splits=2)]


def shapes(tensor_parallel_size: int = 1) -> dict:
    """The layer's shapes, or one rank's under tensor parallelism (each expert's inner size split over the ranks)."""
    hf = load_model_spec(CONFIG).hf
    return dict(hidden=hf["hidden_size"], inner=hf["moe_intermediate_size"] // tensor_parallel_size,
                experts=hf["num_experts"], top_k=hf["top_k_experts"])


def bf16_experts(s: dict) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    e, h, i = s["experts"], s["hidden"], s["inner"]
    gate_up = (torch.randn(e, 2 * i, h, device="cuda", generator=gen) * h ** -0.5).to(torch.bfloat16)
    down = (torch.randn(e, h, i, device="cuda", generator=gen) * i ** -0.5).to(torch.bfloat16)
    return gate_up, down


def quantized(weight: torch.Tensor) -> tuple[ExpertWeights, torch.Tensor, torch.Tensor]:
    """(the fused kernels' padded MXFP4 weights, the checkpoint's packed bytes and scales), expert by expert."""
    packed = [mxfp4.quantize(w.float()) for w in weight]
    padded = [pad_to_k_align(p, s) for p, s in packed]
    scale = torch.stack([s for _, s in padded])
    return (ExpertWeights(torch.stack([p for p, _ in padded]), scale, needs_wide_scales(scale)),
            torch.stack([p for p, _ in packed]), torch.stack([s for _, s in packed]))


def routing(tokens: int, s: dict, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    probs = torch.softmax(torch.randn(tokens, s["experts"], device="cuda", generator=gen), dim=-1)
    weights, ids = torch.topk(probs, s["top_k"], dim=-1)
    x = torch.randn(tokens, s["hidden"], device="cuda", generator=gen).to(torch.bfloat16)
    return x, weights / weights.sum(-1, keepdim=True), ids


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def eager_ms(fn, flush) -> float:
    times = []
    for i in range(WARMUP + EAGER_REPEATS):
        flush()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 1 GiB device copy."""
    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (eager_ms(lambda: dst.copy_(src), lambda: None) * 1e-3)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,4,32,512")
    parser.add_argument("--sweep", action="store_true", help="also time each SWEEP config of the fused kernels")
    parser.add_argument("--projections", action="store_true",
                        help="time gate_up and down apart under each PROJECTION_SWEEP tile, on the picked rows per "
                             "tile (bf16, grouped kernels): the prefill tiles' sweep")
    parser.add_argument("--tails", action="store_true",
                        help="time the picked grouped config (bf16 and MXFP4) with each tail_m: the whole op, and "
                             "each bf16 projection alone")
    parser.add_argument("--kernels", action="store_true",
                        help="also time the few-pairs bf16 kernels one by one at batch 1 against the copy bandwidth")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="one rank's share of the layer under tensor parallelism (inner size / N)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    s = shapes(args.tensor_parallel_size)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, s, flush=True)
    gate_up, down = bf16_experts(s)
    (fp4_gate_up, packed_gate_up, scale_gate_up), (fp4_down, packed_down, scale_down) = map(quantized, (gate_up, down))
    bf16_bytes = 3 * s["hidden"] * s["inner"] * 2
    fp4_bytes = sum(t[0].numel() for t in (packed_gate_up, scale_gate_up, packed_down, scale_down))
    bandwidth = copy_bandwidth()
    flush_buffer = torch.ones(64 * 2**20, dtype=torch.float32, device="cuda")
    flush = flush_buffer.sum
    failures, rows = [], []
    for tokens in map(int, args.batches.split(",")):
        x, weights, ids = routing(tokens, s, seed=tokens)
        paths = {
            "loop": lambda: torch_ref.moe_experts(x, gate_up, down, weights, ids),
            "bf16": lambda: moe_gemm.moe_experts(x, gate_up, down, weights, ids),
            "mxfp4": lambda: moe_gemm.mxfp4_moe_experts(x, fp4_gate_up.weight, fp4_gate_up.scale, fp4_down.weight,
                                                        fp4_down.scale, weights, ids, True, fp4_gate_up.wide_scales
                                                        or fp4_down.wide_scales),
        }
        fp4_kinds = ["mxfp4"]
        if moe_gemv.use_gemv(ids.numel()):  # the few-pairs fp32 multiply-adds, beside the fp8 MMAs the op takes
            paths["mxfp4-fma"] = lambda: moe_gemv.gemv_experts(x, fp4_gate_up, fp4_down, weights, ids, True)
            fp4_kinds.append("mxfp4-fma")
        want = {"bf16": torch_ref.moe_experts(x.float(), gate_up.float(), down.float(), weights, ids),
                "mxfp4": torch_ref.mxfp4_moe_experts(x.float(), packed_gate_up, scale_gate_up, packed_down,
                                                     scale_down, weights, ids, True)}
        want["loop"], want["mxfp4-fma"] = want["bf16"], want["mxfp4"]
        for name, fn in paths.items():
            runs = [("eager", fn())] + ([("graph", replayed(fn))] if name != "loop" else [])
            for how, got in runs:
                err = relative_error(got, want[name])
                if not err < MAX_RELATIVE_ERROR or not torch.isfinite(got).all():
                    failures.append(f"{name} batch {tokens} {how}: relative error {err:.2e}")
        eager = {name: eager_ms(fn, flush) for name, fn in paths.items()}
        graph = {name: graph_ms(paths[name], flush) for name in ["bf16", *fp4_kinds]}
        touched = ids.unique().numel()
        roof = {"bf16": touched * bf16_bytes / bandwidth * 1e3}
        roof.update({name: touched * fp4_bytes / bandwidth * 1e3 for name in fp4_kinds})
        for name in ["bf16", *fp4_kinds]:
            rows.append(f"{tokens:>5} {name:>9} {eager['loop'] * 1e3:9.1f} {eager[name] * 1e3:9.1f} "
                        f"{graph[name] * 1e3:9.1f} {eager['loop'] / eager[name]:15.1f}x "
                        f"{eager['loop'] / graph[name]:15.1f}x {roof[name] * 1e3:12.1f} "
                        f"{graph[name] / roof[name]:10.2f}x  {touched}")
            print(rows[-1], flush=True)
        print(f"{tokens:>5}   bf16/mxfp4 graph time: {graph['bf16'] / graph['mxfp4']:.2f}x", flush=True)
        if args.sweep:
            sweep(tokens, x, weights, ids, gate_up, down, fp4_gate_up, fp4_down, flush)
        if args.projections:
            sweep_projections(tokens, x, weights, ids, gate_up, down, s, bandwidth, flush)
        if args.tails and not moe_gemv.use_gemv(ids.numel()):
            sweep_tails(tokens, x, weights, ids, (gate_up, down), (fp4_gate_up, fp4_down), s, flush)
    if args.kernels:
        kernels_alone(s, gate_up, down, bandwidth, flush)
    print(f"\ncopy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(f"{'batch':>5} {'path':>9} {'loop us':>9} {'eager us':>9} {'graph us':>9} {'loop/eager':>16} "
          f"{'loop/graph':>16} {'roofline us':>12} {'graph/roof':>11}  experts touched")
    print("\n".join(rows))
    print("\ncheck vs fp32 reference:", "FAILED\n  " + "\n  ".join(failures) if failures else "passed")
    return 1 if failures else 0


def sweep(tokens, x, weights, ids, gate_up, down, fp4_gate_up, fp4_down, flush) -> None:
    """Graph times of the fused kernels under each config of SWEEP (the grouped kernels; the MXFP4 input
    quantization excluded) or, for few pairs, GEMV_SWEEP and FP8_GEMV_SWEEP (the few-pairs kernels; quantization
    included)."""
    bf16 = (x, ExpertWeights(gate_up), ExpertWeights(down), False)
    fp4 = (moe_gemm.quantize_dequantize(x), fp4_gate_up, fp4_down, True)
    gemv = moe_gemv.use_gemv(ids.numel())
    for name, (rows, gu, dn, quantize) in (("bf16", bf16), ("mxfp4", fp4)):
        times = {}
        for config in GEMV_SWEEP if gemv else SWEEP:
            def call(config=config):
                if gemv:
                    return moe_gemv.gemv_experts(x, gu, dn, weights, ids, quantize, config=config)
                return moe_gemm.fused_experts(rows, gu, dn, weights, ids, quantize_inner=quantize, config=config)
            try:
                times[config] = graph_ms(call, flush)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit this GPU is left out, said
                print(f"  {config}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        print_sweep(f"{name} batch {tokens}", times)
    if gemv:
        times = {config: graph_ms(lambda config=config: moe_gemv_fp8.gemv_experts_fp8(
            x, fp4_gate_up, fp4_down, weights, ids, config), flush) for config in FP8_GEMV_SWEEP}
        print_sweep(f"mxfp4 fp8 batch {tokens}", times)


def sweep_projections(tokens, x, weights, ids, gate_up, down, s: dict, bandwidth: float, flush) -> None:
    """Graph time of each grouped projection alone (routing outside the timed call) on the rows per tile (block_m,
    tail_m) that pick_config gives these tokens on NVIDIA, under each tile of PROJECTION_SWEEP, each against its
    touched experts' weight bytes at the copy bandwidth; the best of each projection, and the picked tile's time.
    Each tile's output is checked against the first tile's: one that computes something else is said and left out."""
    gu, dn = ExpertWeights(gate_up), ExpertWeights(down)
    flat_weights = weights.reshape(-1).contiguous()
    touched = ids.unique().numel()
    projection_bytes = touched * s["hidden"] * s["inner"] * 2
    picked = moe_gemm.pick_config(ids.numel(), s["experts"], nvidia=True)
    block_m = picked.block_m
    tiles = group_by_expert(ids, s["experts"], block_m)
    inner = moe_gemm._gate_up(x, gu, tiles, s["top_k"], False, picked)
    row = torch.arange(tiles.pair_of_row.numel(), device=x.device)
    tile = row // block_m
    written = (tiles.tile_expert[tile] >= 0) & (row % block_m < tiles.tile_rows[tile])  # gate_up's other rows: unset
    for name, weight_bytes in (("gate_up", 2 * projection_bytes), ("down", projection_bytes)):
        times, first = {}, None
        for t in PROJECTION_SWEEP[name]:
            config = MoeConfig(block_m, t, t, tail_m=picked.tail_m)
            if name == "gate_up":
                def call(config=config):
                    return moe_gemm._gate_up(x, gu, tiles, s["top_k"], False, config)
            else:
                def call(config=config):
                    return moe_gemm._down(inner, dn, tiles, flat_weights, config)
            try:
                got = call().float()
                got = got[written] if name == "gate_up" else got
                first = got if first is None else first
                err = relative_error(got, first)
                if not err < MAX_RELATIVE_ERROR:
                    print(f"  {name} {t}: relative error {err:.2e} against the first tile, left out", flush=True)
                    continue
                times[t] = graph_ms(call, flush)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit this GPU is left out, said
                print(f"  {name} {t}: {type(e).__name__}: {str(e)[:100]}", flush=True)
        best = min(times, key=times.get)
        now = getattr(picked, name)
        roof = weight_bytes / bandwidth * 1e3
        listing = " ".join(f"{ms * 1e3:.0f}" for ms in times.values())
        print(f"  {tokens} tokens {name} block_m {block_m} tail_m {picked.tail_m}: {listing} us; best "
              f"{times[best] * 1e3:.1f} us = {times[best] / roof:.2f}x its weight bytes, {best}; picked "
              f"{times.get(now, float('nan')) * 1e3:.1f} us, {now}", flush=True)


def sweep_tails(tokens, x, weights, ids, bf16, fp4, s: dict, flush) -> None:
    """Graph times of the op under its picked config with tail_m = block_m (no tail path), block_m / 2 and / 4 (at
    least 16): bf16 and MXFP4 whole (routing and slot sum included), and each bf16 projection alone."""
    gu, dn = ExpertWeights(bf16[0]), ExpertWeights(bf16[1])
    flat_weights = weights.reshape(-1).contiguous()
    xq = moe_gemm.quantize_dequantize(x)
    for mxfp4_weights in (False, True):
        picked = moe_gemm.pick_config(ids.numel(), s["experts"], nvidia=True, mxfp4=mxfp4_weights)
        tails = [t for t in (picked.block_m, picked.block_m // 2, picked.block_m // 4) if t >= 16]
        for tail in tails:
            config = MoeConfig(picked.block_m, picked.gate_up, picked.down, tail)
            if mxfp4_weights:
                whole = graph_ms(lambda: moe_gemm.fused_experts(xq, *fp4, weights, ids, quantize_inner=True,
                                                                config=config), flush)
                print(f"  {tokens} tokens mxfp4 block_m {config.block_m} tail_m {tail}: op {whole * 1e3:.1f} us",
                      flush=True)
                continue
            tiles = group_by_expert(ids, s["experts"], config.block_m)
            inner = moe_gemm._gate_up(x, gu, tiles, s["top_k"], False, config)
            whole = graph_ms(lambda: moe_gemm.fused_experts(x, gu, dn, weights, ids, config=config), flush)
            up = graph_ms(lambda: moe_gemm._gate_up(x, gu, tiles, s["top_k"], False, config), flush)
            down = graph_ms(lambda: moe_gemm._down(inner, dn, tiles, flat_weights, config), flush)
            print(f"  {tokens} tokens bf16 block_m {config.block_m} tail_m {tail}: op {whole * 1e3:.1f} us, gate_up "
                  f"{up * 1e3:.1f}, down {down * 1e3:.1f}", flush=True)


def kernels_alone(s: dict, gate_up: torch.Tensor, down: torch.Tensor, bandwidth: float, flush) -> None:
    """Graph times of the few-pairs bf16 op at one token and of each of its kernels alone, each against the time
    its weight bytes take at the copy bandwidth (what a kernel's start and tail cost at these sizes)."""
    x, weights, ids = routing(1, s, seed=1)
    flat_ids, flat_weights = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    gu, dn, tiles = ExpertWeights(gate_up), ExpertWeights(down), moe_gemv.bf16_config(s["inner"])
    inner = moe_gemv.gate_up_gemv(x, gu, flat_ids, s["top_k"], False, tiles.gate_up)
    projection_bytes = s["top_k"] * s["hidden"] * s["inner"] * 2
    calls = {
        "op (gate_up, down, slot sum)": (lambda: moe_gemv.gemv_experts(x, gu, dn, weights, ids, False),
                                         3 * projection_bytes),
        "gate_up kernel": (lambda: moe_gemv.gate_up_gemv(x, gu, flat_ids, s["top_k"], False, tiles.gate_up),
                           2 * projection_bytes),
        "down kernel": (lambda: moe_gemv.down_gemv(inner, dn, flat_ids, flat_weights, False, tiles.down, x),
                        projection_bytes),
    }
    for name, (fn, nbytes) in calls.items():
        ms = graph_ms(fn, flush)
        print(f"  batch 1 bf16 {name}: {ms * 1e3:.1f} us for {nbytes / 1e6:.1f} MB, {nbytes / ms / 1e9:.2f} TB/s, "
              f"{ms / (nbytes / bandwidth * 1e3):.2f}x its bytes at the copy bandwidth", flush=True)


def print_sweep(label: str, times: dict) -> None:
    """Each config's graph time (ms in times) in order, and the best."""
    best = min(times, key=times.get)
    listing = " ".join(f"{t * 1e3:.1f}" for t in times.values())
    print(f"  sweep {label}: {listing} us; best {times[best] * 1e3:.1f} us {best}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
