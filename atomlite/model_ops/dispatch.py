"""The one table that decides which backend runs each op: aiter | triton | torch, and why.

Layers ask `choose(op, **shape)` once, at construction, and keep the function they get: the forward path never
branches on device. Each backend package exposes OPS (name -> function) and limits(op, platform, shape), which
returns None when it can serve the shape or a reason why not; and GRAPH_UNSAFE (name -> why) for the functions a
CUDA/HIP graph cannot capture (they sync with the host).
"""
import contextlib
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from atomlite.model_ops.platform import Platform

logger = logging.getLogger("atomlite.dispatch")

BACKEND_PREFERENCES = ("auto", "triton", "torch")
_BACKEND_MODULES = {"aiter": "atomlite.model_ops.aiter", "triton": "atomlite.model_ops.triton",
                    "torch": "atomlite.model_ops.torch_ref"}


@dataclass(frozen=True)
class KernelChoice:
    op: str
    backend: str
    reason: str
    fn: Callable
    graph_unsafe_reason: str | None = None  # why a graph cannot capture fn; None when it can

    @property
    def graph_safe(self) -> bool:
        return self.graph_unsafe_reason is None


@dataclass(frozen=True)
class Selector:
    platform: Platform = Platform()
    prefer: str = "auto"


_active = Selector()
_logged: set[tuple[str, str, str]] = set()
choices_made: dict[str, KernelChoice] = {}


@contextlib.contextmanager
def use(platform: Platform, prefer: str = "auto"):
    """Layers built inside this block pick kernels for `platform` under the given preference."""
    global _active
    if prefer not in BACKEND_PREFERENCES:
        raise ValueError(f"kernel backend {prefer!r} is not one of {', '.join(BACKEND_PREFERENCES)}")
    previous, _active = _active, Selector(platform, prefer)
    try:
        yield
    finally:
        _active = previous


def _backend(name: str):
    return importlib.import_module(_BACKEND_MODULES[name])


def _candidates(platform: Platform, prefer: str) -> list[tuple[str, str]]:
    """Backends to try in order, each with the reason it is considered."""
    if prefer == "torch":
        return [("torch", "--kernel-backend torch")]
    if prefer == "triton":
        return [("triton", "--kernel-backend triton"), ("torch", "no triton kernel")]
    order = []
    if platform.kind == "rocm" and platform.has_aiter:
        order.append(("aiter", f"aiter on {platform.arch}"))
    if platform.is_gpu:
        order.append(("triton", f"triton on {platform.kind}"))
    order.append(("torch", "reference on cpu" if not platform.is_gpu else "no faster kernel"))
    return order


def choose(op: str, platform: Platform | None = None, prefer: str | None = None, **shape) -> KernelChoice:
    platform = platform or _active.platform
    prefer = prefer or _active.prefer
    skipped = []
    for name, why in _candidates(platform, prefer):
        backend = _backend(name)
        fn = backend.OPS.get(op)
        if fn is None:
            skipped.append(f"{name}: no {op} kernel")
            continue
        refusal = backend.limits(op, platform, shape)
        if refusal is not None:
            skipped.append(f"{name}: {refusal}")
            continue
        reason = "; ".join([why] + skipped)
        unsafe = getattr(backend, "GRAPH_UNSAFE", {}).get(op)
        return _record(KernelChoice(op, name, reason, fn, unsafe), shape)
    raise RuntimeError(f"no backend implements {op}")


def _record(choice: KernelChoice, shape: dict) -> KernelChoice:
    shape_text = ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
    key = f"{choice.op}[{shape_text}]" if shape_text else choice.op
    choices_made[key] = choice
    if (key, choice.backend, choice.reason) not in _logged:
        _logged.add((key, choice.backend, choice.reason))
        logger.info("kernel %s -> %s (%s)", key, choice.backend, choice.reason)
    return choice


def describe_choices() -> list[str]:
    return [f"{key}: {c.backend} ({c.reason})" for key, c in sorted(choices_made.items())]
