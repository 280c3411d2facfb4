"""A kernel only NVIDIA can compile (inline PTX), for the compile gate's test that it reports such a kernel."""
import torch
import triton
import triton.language as tl

from atomlite.model_ops.triton.common import KernelLaunch

_ADD_ONE_PTX = tl.constexpr("add.s32 $0, $1, 1;")


@triton.jit
def _ptx_kernel(x, out, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    values = tl.load(x + offsets)
    plus_one = tl.inline_asm_elementwise(_ADD_ONE_PTX, "=r,r", [values], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out + offsets, plus_one)


def ptx_launches(platform) -> list[tuple[str, KernelLaunch]]:
    x = torch.empty(64, dtype=torch.int32, device="meta")
    return [("inline PTX fixture", KernelLaunch(_ptx_kernel, (1,), (x, x), {"BLOCK": 64, "num_warps": 1}))]
