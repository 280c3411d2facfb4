"""Prefill attention at real layer shapes, as a prefill graph replays it: each tile config's GPU time against the
layer's FLOPs at the probed bf16 GEMM rate.

    PYTHONPATH=. python bench/prefill_attention.py [--tokens 512,2048] [--shapes 31B-global,26B-A4B-sliding]
        [--block-size 16] [--chosen]

One prompt of --tokens tokens per layer shape of 31B and 26B-A4B (bench/decode_attention.py's SHAPES): sliding layers
read K and V over their window; global layers store V alone and rebuild K, either once for the step (build_keys, as an
eager prefill does, timed with the attention) or inside the attention kernel (as a prefill graph does, the host
knowing no lengths). Each config is checked against the torch reference first, then timed 20 calls to one CUDA graph.
The first config of a shape is the launcher's own choice (pick_config).
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_attention import SHAPES, graph_us, key_rule  # noqa: E402  (bench/ is this script's folder)
from kernels import check, paged_cache  # noqa: E402

from atomlite.model_ops import torch_ref  # noqa: E402
from atomlite.model_ops.k_from_v import KFromV  # noqa: E402
from atomlite.model_ops.triton.attention import paged as tri  # noqa: E402

A = tri.AttnConfig
# (query rows incl. the GQA group, keys per tile, warps, stages); those that do not fit the GPU are reported
TILES = {
    256: [A(128, 64, 8, 2), A(64, 64, 4, 2), A(64, 64, 8, 2), A(128, 64, 8, 3), A(128, 32, 8, 3), A(128, 32, 4, 3),
          A(64, 32, 4, 3), A(256, 32, 8, 2), A(128, 128, 8, 1), A(128, 128, 8, 2), A(128, 64, 8, 1), A(128, 64, 4, 2),
          A(64, 128, 4, 2), A(128, 64, 16, 2)],
    512: [A(64, 32, 8, 2), A(64, 16, 8, 2), A(64, 32, 4, 2), A(64, 64, 8, 1), A(32, 32, 4, 2), A(64, 16, 8, 3),
          A(128, 16, 8, 2), A(32, 64, 4, 2)],
}
# a head's output columns in two programs (value_parts): half the accumulator each, the scores computed twice
SPLIT_VALUES = {
    256: [A(128, 64, 8, 2, value_parts=2), A(128, 128, 8, 2, value_parts=2), A(256, 64, 8, 2, value_parts=2)],
    512: [A(64, 32, 8, 2, value_parts=2), A(64, 64, 8, 2, value_parts=2), A(128, 32, 8, 2, value_parts=2),
          A(64, 32, 4, 2, value_parts=2), A(32, 32, 4, 2, value_parts=2), A(128, 64, 8, 2, value_parts=2),
          A(64, 64, 4, 2, value_parts=2), A(64, 32, 8, 3, value_parts=2), A(128, 16, 8, 2, value_parts=2),
          A(128, 32, 8, 1, value_parts=2), A(128, 32, 4, 2, value_parts=2), A(256, 16, 8, 2, value_parts=2),
          A(128, 32, 16, 2, value_parts=2)],
}


def tile_name(config) -> str:
    parts = f"/{config.value_parts}v" if config.value_parts > 1 else ""
    return f"{config.block_m}x{config.block_n}/{config.num_warps}w/{config.num_stages}s{parts}"


def gemm_rate() -> float:
    """bf16 FLOP/s of a large matmul, the roofline's rate."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / (graph_us(lambda: a @ b) * 1e-6)


def flops(tokens: int, heads: int, head_dim: int, window: int | None) -> float:
    keys = sum(min(i + 1, window or tokens) for i in range(tokens))
    return 4 * heads * head_dim * keys


def measure(shape, tokens: int, rate: float, block_size: int = 16, chosen_only: bool = False) -> None:
    model, layer, heads, kv_heads, head_dim, window = shape
    k_cache, v_cache, table, seq_lens = paged_cache(1, tokens, kv_heads, head_dim, block_size)
    q = torch.randn(tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    starts = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
    scale = head_dim ** -0.5
    rule = key_rule(head_dim, tokens + 1) if window is None else None
    if rule is not None:
        k_cache = None
    rule32 = None if rule is None else KFromV(rule.weight.float(), rule.cos, rule.sin, rule.rotary_pairs)
    ref = torch_ref.paged_attention(q.float(), None if k_cache is None else k_cache.float(), v_cache.float(), table,
                                    seq_lens, starts, scale, window, k_from_v=rule32)
    bound_us = flops(tokens, heads, head_dim, window) / rate * 1e6
    ways = {"keys built once": "built", "keys in the kernel": "derived"} if rule is not None else {"": "plain"}
    row_starts = tri.key_row_starts([tokens], q.device)  # a host copy: made before any graph capture
    for label, way in ways.items():
        chosen = tri.pick_config(q, v_cache, table, heads // kv_heads, derive_k=way == "derived", window=window,
                                 max_query_len=tokens)
        results = []
        tiles = [] if chosen_only else TILES[head_dim] + SPLIT_VALUES[head_dim]
        for config in [chosen] + [c for c in tiles if c != dataclasses.replace(chosen, num_splits=1)]:
            def call(config=config):
                built = None
                if way == "built":
                    built = tri.build_keys(v_cache, table, seq_lens, row_starts, tokens, tokens, rule, q.dtype)
                return tri.launch(q, k_cache, v_cache, table, seq_lens, starts, scale, window, False, config, rule,
                                  built)
            try:
                ok = check(f"{model} {layer} {tokens} {way} {config}", call(), ref)
                took = graph_us(call)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit this GPU is left out, said
                results.append(f"{tile_name(config)}: {type(e).__name__}")
                continue
            mark = "" if ok else " CHECK FAILED"
            results.append(f"{tile_name(config)}: {took:.0f} us ({took / bound_us:.1f}x){mark}")
        print(f"{model} {layer}, {tokens} tokens{', ' + label if label else ''} (FLOPs {bound_us:.0f} us; the "
              f"chosen tile first): " + "; ".join(results), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="512,2048")
    parser.add_argument("--shapes", default="", help="model-layer pairs, e.g. 31B-global (default: every shape)")
    parser.add_argument("--block-size", type=int, default=16,
                        help="the cache's tokens per block (the engine's --block-size; one block per prompt shows "
                             "what the block-table gather costs)")
    parser.add_argument("--chosen", action="store_true", help="time only the tile the launcher picks")
    args = parser.parse_args()
    torch.manual_seed(0)
    rate = gemm_rate()
    print(f"device: {torch.cuda.get_device_name()}; bf16 GEMM rate {rate / 1e12:.0f} TFLOP/s", flush=True)
    wanted = set(filter(None, args.shapes.split(",")))
    for tokens in (int(t) for t in args.tokens.split(",")):
        for shape in SHAPES:
            if not wanted or f"{shape[0]}-{shape[1]}" in wanted:
                measure(shape, tokens, rate, args.block_size, args.chosen)


if __name__ == "__main__":
    main()
