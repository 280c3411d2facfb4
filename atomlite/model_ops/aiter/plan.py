"""What kernel each op gets on a platform, before anything is loaded: `atomlite plan --kernels --platform gfx950+aiter`.

Goes through dispatch.choose, so the answer is the table's own. Nothing is imported from AITER for a hand-made
platform (its availability comes from the pinned signatures).
"""
from dataclasses import dataclass

from atomlite.model_ops import dispatch
from atomlite.model_ops.platform import Platform

# Gemma 4's shapes (shared/docs/GEMMA4.md): sliding layers head_dim 256, global layers 512; plus an FP4 linear.
GEMMA4_SHAPES: tuple[tuple[str, dict], ...] = (
    ("attention", dict(head_dim=256, window=True, gqa=2)),
    ("attention", dict(head_dim=512, window=False, gqa=8)),
    ("write_kv", dict(head_dim=256)),
    ("write_kv", dict(head_dim=512)),
    ("rms_norm", dict(dim=2560)),
    ("add_rms_norm", dict(dim=2560)),
    ("rope", dict(head_dim=256)),
    ("rope", dict(head_dim=512)),
    ("gelu_tanh_and_mul", dict(dim=10240)),
    ("moe_experts", dict(experts=128)),
    ("mxfp4_linear", dict(n=2560, k=10240, dynamic_input=True)),
)

@dataclass(frozen=True)
class KernelRow:
    op: str
    shape: dict
    backend: str
    reason: str

    def describe(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.shape.items())
        return f"{self.op}[{shape}]: {self.backend} ({self.reason})"


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


def plan_kernels(platform: Platform, prefer: str = "auto",
                 shapes: tuple[tuple[str, dict], ...] = GEMMA4_SHAPES) -> list[KernelRow]:
    rows, made = [], dict(dispatch.choices_made)
    try:
        for op, shape in shapes:
            choice = dispatch.choose(op, platform, prefer, **shape)
            rows.append(KernelRow(op, shape, choice.backend, choice.reason))
    finally:
        # A what-if query must not show up among the kernels the running model chose (describe_choices).
        dispatch.choices_made.clear()
        dispatch.choices_made.update(made)
    return rows
