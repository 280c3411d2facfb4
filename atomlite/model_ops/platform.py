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
