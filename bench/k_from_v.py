"""Attention on a global (k_eq_v) layer with V alone in the cache, against today's K+V kernel, in the same run.

    PYTHONPATH=. python bench/k_from_v.py

31B global-layer shapes: head_dim 512, 32 query / 4 KV heads, proportional RoPE (64 of 256 pairs turn), bf16.
Decode at batch 32 and 8k context (memory-bound: the V-only kernel reads half the bytes) and prefill of one
8k-token sequence (compute-bound). The V-only path runs twice: as a caller without the lengths on the host gets it
(keys rebuilt from V in every tile) and as the engine calls it (decode still rebuilds in the kernel; a prefill
builds the step's keys once, then runs the K+V kernel on them). Every path is checked against the torch reference
first.
"""
import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.context import HostBatch
from atomlite.model_ops import triton as tri
from atomlite.model_ops.triton.attention import paged as tri_attention
from atomlite.model_ops.k_from_v import KFromV, rotary_pairs
from atomlite.model_ops.rope import RotaryEmbedding, proportional_inv_freq
from kernels import check, decode_case, median_ms, prefill_case

HEAD_DIM, HEADS, KV_HEADS, CONTEXT = 512, 32, 4, 8192


def key_rule() -> KFromV:
    inv_freq = proportional_inv_freq(HEAD_DIM, 1e6, 0.25)
    rope = RotaryEmbedding(HEAD_DIM, inv_freq, CONTEXT + 1).cuda()
    weight = (1.0 + 0.1 * torch.randn(HEAD_DIM, device="cuda")).to(torch.bfloat16)
    return KFromV(weight, rope.cos_table, rope.sin_table, rotary_pairs(inv_freq))


def compare(name: str, args, rule: KFromV, bytes_both: int) -> None:
    q, k_cache, v_cache, table, seq_lens, starts = args
    scale = HEAD_DIM ** -0.5
    both = lambda: tri.paged_attention(q, k_cache, v_cache, table, seq_lens, starts, scale)  # noqa: E731
    v_only = lambda: tri.paged_attention(q, None, v_cache, table, seq_lens, starts, scale, k_from_v=rule)  # noqa: E731
    # as the engine calls it: the step's lengths on the host and, for a prefill, the row starts of the keys it then
    # builds once (the step metadata the engine builds once per step, outside the timed call)
    host = HostBatch.of(starts.tolist(), seq_lens.tolist())
    derived = None if host.decode_only else tri_attention.key_row_starts(host.seq_lens, q.device)
    def v_engine():
        return tri.paged_attention(q, None, v_cache, table, seq_lens, starts, scale, k_from_v=rule, host=host,
                                   derived=derived)

    upcast = [a.float() if a.is_floating_point() else a for a in (q, v_cache)]
    ref = torch_ref.paged_attention(upcast[0], None, upcast[1], table, seq_lens, starts, scale,
                                    k_from_v=KFromV(rule.weight.float(), rule.cos, rule.sin, rule.rotary_pairs))
    ok = check(f"{name} V only", v_only(), ref) & check(f"{name} V only, host lengths", v_engine(), ref)
    ms_both, ms_v, ms_engine = median_ms(both), median_ms(v_only), median_ms(v_engine)
    print(f"{name}: K+V {ms_both:.3f} ms ({bytes_both / ms_both / 1e9:.2f} TB/s of K+V); V only, keys rebuilt per "
          f"tile {ms_v:.3f} ms ({bytes_both / 2 / ms_v / 1e9:.2f} TB/s of V), K+V / V only = {ms_both / ms_v:.2f}x; "
          f"with the host's lengths (as the engine runs it) {ms_engine:.3f} ms, K+V / V only = "
          f"{ms_both / ms_engine:.2f}x{'' if ok else '  (CHECK FAILED)'}", flush=True)
    lengths = seq_lens.tolist()
    row_starts = tri_attention.key_row_starts(lengths, q.device)
    def build():
        return tri_attention.build_keys(v_cache, table, seq_lens, row_starts, sum(lengths), max(lengths), rule,
                                        q.dtype)
    print(f"  building the keys alone: {median_ms(build):.3f} ms", flush=True)


def main():
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    rule = key_rule()
    decode = decode_case(32, CONTEXT, HEADS, KV_HEADS, HEAD_DIM)
    compare(f"decode B=32 ctx={CONTEXT} D={HEAD_DIM} {HEADS}q/{KV_HEADS}kv", decode, rule,
            2 * 32 * CONTEXT * KV_HEADS * HEAD_DIM * 2)
    _, _, _, prefill = prefill_case(CONTEXT, HEADS, KV_HEADS, HEAD_DIM)
    compare(f"prefill S={CONTEXT} D={HEAD_DIM} {HEADS}q/{KV_HEADS}kv", prefill, rule,
            2 * CONTEXT * KV_HEADS * HEAD_DIM * 2)


if __name__ == "__main__":
    main()
