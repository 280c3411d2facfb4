"""What hardware the kernels run on: detected once, or described by hand to ask the dispatch table 'what if'."""
from dataclasses import dataclass
from importlib.util import find_spec

import torch


@dataclass(frozen=True)
class Platform:
    kind: str = "cpu"
    arch: str | None = None
    has_aiter: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    @property
    def has_fp8(self) -> bool:
        """Whether the kernels can convert e4m3 here: NVIDIA from sm_89, AMD gfx942 / gfx950, the CPU in torch
        (an unnamed arch is given the benefit of the doubt)."""
        if self.kind == "cuda" and self.arch:
            return int(self.arch.removeprefix("sm_")) >= 89
        if self.kind == "rocm" and self.arch:
            return self.arch in ("gfx942", "gfx950")
        return True

    @property
    def fp8_dtype(self) -> torch.dtype:
        """The e4m3 format this platform computes with: MI300X (gfx942) has the fnuz variant."""
        return torch.float8_e4m3fnuz if self.arch == "gfx942" else torch.float8_e4m3fn

    @property
    def block_size(self) -> int:
        """--block-size's default here. On NVIDIA a 64-token block holds a whole key tile of the Triton attention,
        which then finds the tile's keys in one block, not four (a 2048-token prefill of 26B-A4B's sliding layer:
        110 us on 16-token blocks, 95 on one block, bench/prefill_attention.py --block-size). 26B-A4B TTFT of 2040
        tokens 36.44, 36.53 -> 35.36, 35.85 ms, 31B of 2048 tokens 211.3, 212.2 -> 210.2, 209.0 ms; batch-1 TPOT
        and the 256-request load unchanged (H200, `bench latency` / `throughput`, 16 and 64 alternating in one
        call). AITER's paged decode reads 16-token blocks, so ROCm keeps 16, as does the CPU."""
        return 64 if self.kind == "cuda" else 16

    def describe(self) -> str:
        parts = [self.kind] + ([self.arch] if self.arch else []) + (["aiter"] if self.has_aiter else [])
        return " ".join(parts)


def detect_platform(device: torch.device) -> Platform:
    if device.type != "cuda":
        return Platform("cpu")
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        arch = getattr(props, "gcnArchName", "").split(":")[0] or None
        return Platform("rocm", arch, has_aiter=find_spec("aiter") is not None)
    return Platform("cuda", f"sm_{props.major}{props.minor}")


def parse_platform(text: str) -> Platform:
    """'gfx950+aiter', 'gfx942', 'rocm', 'cuda', 'sm_90', 'cpu' -> Platform (what `--platform` accepts)."""
    name, _, extra = text.strip().lower().partition("+")
    if extra not in ("", "aiter"):
        raise ValueError(f"--platform {text!r}: only '+aiter' may follow the device (e.g. gfx950+aiter)")
    if name == "cpu" and not extra:
        return Platform("cpu")
    if name == "cuda" or name.startswith("sm_"):
        if extra:
            raise ValueError(f"--platform {text!r}: AITER exists only on ROCm (gfx942, gfx950)")
        return Platform("cuda", name if name.startswith("sm_") else None)
    if name == "rocm" or name.startswith("gfx"):
        return Platform("rocm", name if name.startswith("gfx") else None, has_aiter=bool(extra))
    raise ValueError(f"--platform {text!r} is not one of cpu, cuda, sm_XY, rocm, gfxNNN[+aiter]")
