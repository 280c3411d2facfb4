"""The vision towers' encoder attention in bf16: Triton's kernel against the torch reference (SDPA per image, what
the CPU path runs and the GPU ran before), at the towers' shapes (31B / 26B-A4B: 16 heads x 72; E2B / E4B: 12 x 64)
on one image of 10080 patches (max_soft_tokens 1120) and on two packed (2520 + 10080). Each is checked against the
reference (fp32 upcast) first; TFLOP/s count QK^T and PV over each image's patches (4 T^2 H D per image).

    PYTHONPATH=. python bench/encoder_attention.py
"""
import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.triton.attention.encoder import encoder_attention
from kernels import check, median_ms

SHAPES = [("31B tower", 16, 72), ("E2B tower", 12, 64)]
PACKS = [[10080], [2520, 10080]]


def main() -> int:
    ok = True
    print(f"{'tower':<10} {'images':<13} {'triton ms':>10} {'TFLOP/s':>8} {'sdpa ms':>8} {'TFLOP/s':>8} {'speedup':>8}")
    for name, heads, head_dim in SHAPES:
        for lengths in PACKS:
            total = sum(lengths)
            q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            packed = PackedSequences.of(lengths, "cuda")
            scale = head_dim ** -0.5
            want = torch_ref.encoder_attention(q.float(), k.float(), v.float(), packed, scale)
            ok &= check(f"{name} {lengths}", encoder_attention(q, k, v, packed, scale), want)
            flops = sum(4 * n * n * heads * head_dim for n in lengths)
            ms = median_ms(lambda: encoder_attention(q, k, v, packed, scale))
            ref_ms = median_ms(lambda: torch_ref.encoder_attention(q, k, v, packed, scale))
            print(f"{name:<10} {'+'.join(map(str, lengths)):<13} {ms:>10.3f} {flops / ms / 1e9:>8.1f} "
                  f"{ref_ms:>8.3f} {flops / ref_ms / 1e9:>8.1f} {ref_ms / ms:>8.2f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
