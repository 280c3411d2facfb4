"""The residual update at decode rows, as 31B and 26B-A4B call it, at several warps a row (up to 32, NVIDIA):
microseconds per call in a CUDA graph. A cell is headed by the values a warp takes (the row padded to a power of
two: 8192 for 31B, 4096 for 26B-A4B), so 256 is 32 warps for 31B and 16 for 26B-A4B. norm/tuning.py's warps come
from here.

    PYTHONPATH=. python bench/norm_warps.py
"""
import torch

from atomlite.model_ops.carriers import NormedPair, PartialSums, TokenQuantization
from atomlite.model_ops.triton.norm import residual as res
from decode_attention import graph_us  # bench/ is on the path when a bench script runs

FP8 = TokenQuantization(torch.float8_e4m3fn)


def norm_weight(dim: int) -> torch.Tensor:
    return (1 + 0.1 * torch.randn(dim, device="cuda")).to(torch.bfloat16)


def partial_sums(parts: int, rows: int, dim: int) -> PartialSums:
    return PartialSums(torch.randn(parts, rows, dim, device="cuda"), torch.bfloat16)


def case(name, dim, rows, parts, next_norms, quantized, pair_parts=0, scaled=False):
    """One call as the model makes it: x the split-K sum of `parts` slices (and a second branch of pair_parts)."""
    x = partial_sums(parts, rows, dim)
    if pair_parts:
        x = NormedPair(x, partial_sums(pair_parts, rows, dim), norm_weight(dim), norm_weight(dim))
    residual = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16)
    weight, scale = norm_weight(dim), torch.tensor([0.7], device="cuda", dtype=torch.bfloat16)
    nexts = tuple(norm_weight(dim) for _ in range(next_norms))
    kwargs = {"quantize": FP8} if quantized else {}
    return name, lambda: res.rms_norm_residual(x, residual, weight, 1e-6, scale if scaled else None,
                                               nexts if len(nexts) > 1 else nexts[0], **kwargs)


def main() -> None:
    print(torch.cuda.get_device_name())
    for rows in (1, 16, 64):
        cases = [case("31B post-attn fp8", 5376, rows, 3, 1, True),
                 case("31B post-ff fp8", 5376, rows, 3, 1, True, scaled=True),
                 case("31B post-attn bf16", 5376, rows, 3, 1, False),
                 case("26B post-attn fp8", 2816, rows, 2, 3, True),
                 case("26B join fp8", 2816, rows, 2, 1, True, 8, True),
                 case("26B post-attn bf16", 2816, rows, 2, 3, False),
                 case("26B join bf16", 2816, rows, 2, 1, False, 8, True)]
        for name, fn in cases:
            cells = []
            for per_warp in (128, 256, 512, 1024):
                res.RESIDUAL_VALUES_PER_WARP, res.MAX_WARPS, res.TOKEN_ROWS_MAX_WARPS = per_warp, 32, 32
                cells.append(f"{per_warp}: {graph_us(fn):.2f}")
            print(f"{rows:3d} rows {name:20s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
