"""What image blocks that attend both ways cost a prefill on the sliding layers (31B and 26B-A4B shapes): one
2048-token prefill (the default --max-num-batched-tokens) timed three ways in the same run: text only (key_ends
None, the kernel's text specialization), causal key ends (the key-ends specialization doing the text's work), and
an image of IMAGE_TOKENS soft tokens inside the step. Each is checked against the torch reference first.

    PYTHONPATH=. python bench/key_ends_prefill.py
"""
import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.context import block_key_ends
from atomlite.model_ops.triton.attention import paged as tri
from kernels import check, median_ms, paged_cache

TOKENS, IMAGE_START, IMAGE_TOKENS, WINDOW = 2048, 400, 1120, 1024
SHAPES = [("31B", 32, 16, 256), ("26B-A4B", 16, 8, 256)]


def main() -> int:
    ok = True
    print(f"{'model':<8} {'text ms':>8} {'causal ends ms':>15} {'image ms':>9}")
    for model, heads, kv_heads, head_dim in SHAPES:
        k_cache, v_cache, table, seq_lens = paged_cache(1, TOKENS, kv_heads, head_dim)
        q = torch.randn(TOKENS, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        starts = torch.tensor([0, TOKENS], dtype=torch.int32, device="cuda")
        in_image = [IMAGE_START <= i < IMAGE_START + IMAGE_TOKENS for i in range(TOKENS)]
        ends = {"text": None,
                "causal ends": torch.arange(1, TOKENS + 1, dtype=torch.int32, device="cuda"),
                "image": torch.tensor(block_key_ends(in_image), dtype=torch.int32, device="cuda")}
        args = (q, k_cache, v_cache, table, seq_lens, starts, head_dim ** -0.5, WINDOW)
        times = []
        for name, key_ends in ends.items():
            out = tri.paged_attention(*args, key_ends=key_ends)
            ok &= check(f"{model} {name}", out, torch_ref.paged_attention(*args, key_ends=key_ends))
            times.append(median_ms(lambda: tri.paged_attention(*args, key_ends=key_ends)))
        print(f"{model:<8} {times[0]:>8.3f} {times[1]:>15.3f} {times[2]:>9.3f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
