"""Decode attention at real layer shapes, as a graph replays it: per-layer GPU time against the KV bytes.

    PYTHONPATH=. python bench/decode_attention.py [--contexts 544,4096,32768] [--table-tokens 8192] [--cold] [--tiles]
        [--batch 1,128] [--layers sliding,global]

Issues 18 and 19 measured 19-25 us per attention layer at batch 1 and 544 tokens of context, where the KV bytes
take under 3 us. This times each layer shape of 31B and 26B-A4B (sliding: K+V over the window; global: V alone,
keys rebuilt) with the launcher's own split-KV choice and with each split count forced, every call captured 20
times in one CUDA graph (no host launch cost, as decode graphs run it); an empty kernel's per-launch time in the
same graph is the floor. The block table is sized for --table-tokens, as a captured decode step's is for
--max-model-len (the split count follows it). Every configuration is checked against the torch reference first.
--batch N[,M...] decodes N sequences of the same context at once, as a step under load does (256 x 512 in / 256 out
holds about 150 sequences of 31B FP8 at a mean context of 640).
"""
import argparse
import dataclasses

import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.k_from_v import KFromV, rotary_pairs
from atomlite.model_ops.rope import RotaryEmbedding, proportional_inv_freq
from atomlite.model_ops.triton.attention import paged as tri
from kernels import check, copy_bandwidth, paged_cache

CALLS = 20
# --tiles: (keys per tile, warps, stages) timed at the launcher's split count
TILES = [(16, 4, 2), (32, 4, 1), (32, 4, 2), (32, 4, 3), (64, 4, 1), (64, 4, 2), (64, 4, 3), (64, 8, 1),
         (64, 8, 2)]
FLUSH_BYTES = 256 << 20  # several times any GPU's L2
# (model, layer, query heads, KV heads, head_dim, window or None for a V-only global layer)
SHAPES = [("31B", "sliding", 32, 16, 256, 1024), ("31B", "global", 32, 4, 512, None),
          ("26B-A4B", "sliding", 16, 8, 256, 1024), ("26B-A4B", "global", 16, 2, 512, None)]


def graph_us(fn, before=None) -> float:
    """GPU microseconds per call of fn, from a CUDA graph of CALLS calls, each after before() where given."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            if before is not None:
                before()
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return sorted(times)[len(times) // 2]


def key_rule(head_dim: int, max_positions: int) -> KFromV:
    inv_freq = proportional_inv_freq(head_dim, 1e6, 0.25)
    rope = RotaryEmbedding(head_dim, inv_freq, max_positions).cuda()
    weight = (1.0 + 0.1 * torch.randn(head_dim, device="cuda")).to(torch.bfloat16)
    return KFromV(weight, rope.cos_table, rope.sin_table, rotary_pairs(inv_freq))


def batch(heads: int, kv_heads: int, head_dim: int, context: int, table_tokens: int, num_seqs: int = 1):
    """num_seqs decoding sequences at `context` keys each, their block tables as wide as `table_tokens` (the rest
    unused)."""
    k_cache, v_cache, table, seq_lens = paged_cache(num_seqs, max(context, table_tokens), kv_heads, head_dim)
    seq_lens.fill_(context)
    q = torch.randn(num_seqs, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    starts = torch.arange(num_seqs + 1, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, table, seq_lens, starts


def cold_us(fn, flush) -> float:
    """graph_us with L2 emptied before each call (as in a decode step, where the layers between evict this one's
    KV), less the flush's own time."""
    return graph_us(fn, flush) - graph_us(flush)


def measure(shape, context: int, table_tokens: int, bandwidth: float, flush=None, tiles: bool = False,
            num_seqs: int = 1) -> None:
    model, layer, heads, kv_heads, head_dim, window = shape
    q, k_cache, v_cache, table, seq_lens, starts = batch(heads, kv_heads, head_dim, context, table_tokens, num_seqs)
    scale = head_dim ** -0.5
    rule = key_rule(head_dim, max(context, table_tokens) + 1) if window is None else None
    k_cache = None if rule is not None else k_cache
    upcast = [None if t is None else t.float() for t in (q, k_cache, v_cache)]
    rule32 = None if rule is None else KFromV(rule.weight.float(), rule.cos, rule.sin, rule.rotary_pairs)
    ref = torch_ref.paged_attention(upcast[0], upcast[1], upcast[2], table, seq_lens, starts, scale, window,
                                    k_from_v=rule32)
    chosen = tri.pick_config(q, v_cache, table, heads // kv_heads, derive_k=rule is not None, window=window)
    read = num_seqs * min(context, window or context) * kv_heads * head_dim * 2 * (1 if rule is not None else 2)

    def timed(name: str, config: tri.AttnConfig) -> str:
        """us per call of config, checked against the reference first."""
        def call():
            return tri.launch(q, k_cache, v_cache, table, seq_lens, starts, scale, window, False, config, rule)
        ok = check(f"{model} {layer} ctx={context} {name}", call(), ref)
        took = graph_us(call) if flush is None else cold_us(call, flush)
        return f"{took:.1f} us" + ("" if ok else " (CHECK FAILED)")

    results = []
    tiles_walked = -(-min(context, window or context) // chosen.block_n)
    for splits in sorted({chosen.num_splits} | {s for s in (1, 2, 4, 8, 16, 32, 64) if s <= tiles_walked}):
        label = f"{splits}{' (chosen)' if splits == chosen.num_splits else ''}"
        results.append(f"{label}: {timed(f'splits={splits}', dataclasses.replace(chosen, num_splits=splits))}")
    cold = ", cold L2" if flush else ""
    print(f"{model} {layer} layer, batch {num_seqs}, context {context}{cold} ({read / 1e6:.2f} MB of KV, "
          f"{read / bandwidth * 1e6:.1f} us at the copy bandwidth): splits " + ", ".join(results), flush=True)
    if tiles:
        tiled = [f"{n}/{w}/{st}: " + timed(f"{n}/{w}/{st}", dataclasses.replace(chosen, block_n=n, num_warps=w,
                                                                                 num_stages=st))
                 for n, w, st in TILES]
        print(f"  tiles at {chosen.num_splits} splits (keys per tile / warps / stages): " + ", ".join(tiled),
              flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", default="544,4096,32768")
    parser.add_argument("--table-tokens", type=int, default=8192)
    parser.add_argument("--cold", action="store_true", help="empty the L2 cache before each call")
    parser.add_argument("--tiles", action="store_true", help="also time other tiles, warps and pipeline stages")
    parser.add_argument("--batch", default="1", help="sequences decoding at once, each at the context (a list)")
    parser.add_argument("--layers", default="sliding,global", help="the layer kinds to time")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    # the rate bench latency's roofline takes for bytes: a copy's reads and writes together (a kernel that only
    # reads runs at about it, not at half of it)
    bandwidth = copy_bandwidth()
    empty = torch.empty(1, device="cuda")
    print(f"floor: an empty kernel takes {graph_us(lambda: empty.zero_()):.1f} us per launch in a graph", flush=True)
    flush = None
    if args.cold:
        scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        flush = scratch.zero_
    layers = args.layers.split(",")
    for num_seqs in (int(b) for b in args.batch.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            for shape in (s for s in SHAPES if s[1] in layers):
                measure(shape, context, args.table_tokens, bandwidth, flush, args.tiles, num_seqs)


if __name__ == "__main__":
    main()
