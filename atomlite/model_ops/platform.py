"""What hardware the kernels run on: detected once, or described by hand to ask the dispatch table 'what if'."""
from dataclasses import dataclass
from importlib.util import find_spec

import torch

DEVICE_KINDS = ("cpu", "cuda", "rocm")


@dataclass(frozen=True)
class Platform:
    kind: str = "cpu"
    arch: str | None = None
    has_aiter: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

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
