"""The vision towers' encoder attention in bf16: Triton's kernel against the torch reference (SDPA per image, what
the CPU path runs and the GPU ran before) and, with --split, a head that is no power of two split in two parts
(72 = 64 + 16) against it padded whole to 128 (tuning.ENCODER_SPLIT_HEADS), at the towers' shapes (31B /
26B-A4B: 16 heads x 72; E2B / E4B: 12 x 64) on one image of 10080 patches (max_soft_tokens 1120), two packed
(2520 + 10080) and one 896x896 image (2304). Each is checked against the reference (fp32 upcast) first; TFLOP/s
count QK^T and PV over each image's patches (4 T^2 H D per image).

    PYTHONPATH=. python bench/encoder_attention.py [--split]
"""
import sys

import torch

from atomlite.model_ops import torch_ref
from atomlite.model_ops.packed import PackedSequences
from atomlite.model_ops.triton.attention.encoder import encoder_attention
from kernels import check, median_ms

SHAPES = [("31B tower", 16, 72), ("E2B tower", 12, 64)]
PACKS = [[10080], [2520, 10080], [2304]]


def main() -> int:
    ok, split = True, "--split" in sys.argv[1:]
    ways = {"padded": False, "split": True} if split else {"triton": None}
    print(f"{'tower':<10} {'images':<13}" + "".join(f" {way + ' ms':>10} {'TFLOP/s':>8}" for way in ways)
          + f" {'sdpa ms':>8} {'TFLOP/s':>8}")
    for name, heads, head_dim in SHAPES:
        for lengths in PACKS:
            total = sum(lengths)
            q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            packed = PackedSequences.of(lengths, "cuda")
            scale = head_dim ** -0.5
            want = torch_ref.encoder_attention(q.float(), k.float(), v.float(), packed, scale)
            for way, how in ways.items():
                ok &= check(f"{name} {lengths} {way}", encoder_attention(q, k, v, packed, scale, how), want)
            flops = sum(4 * n * n * heads * head_dim for n in lengths)
            row = f"{name:<10} {'+'.join(map(str, lengths)):<13}"
            for how in ways.values():
                ms = median_ms(lambda: encoder_attention(q, k, v, packed, scale, how))
                row += f" {ms:>10.3f} {flops / ms / 1e9:>8.1f}"
            ref_ms = median_ms(lambda: torch_ref.encoder_attention(q, k, v, packed, scale))
            print(f"{row} {ref_ms:>8.3f} {flops / ref_ms / 1e9:>8.1f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
