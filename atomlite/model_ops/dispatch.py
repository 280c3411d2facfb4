"""The one place that decides which backend runs each op: aiter | triton | torch, and why.

Layers ask `choose(op, **shape)` once, at construction, and keep the function they get: the forward path never
branches on device. The `use` block they are built in names the platform and keeps what was chosen. What each
backend's kernel for an op serves, refuses, can do (CAPABILITIES, which model_ops.fusion reads to link one layer's
kernel to the next) and whether a graph can capture it, the kernel declares beside its code (model_ops.kernels);
this module reads those declarations and keeps no table of its own but the order of the backends.
"""
import contextlib
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from atomlite.model_ops import kernels
from atomlite.model_ops.kernels import CAPABILITIES
from atomlite.model_ops.platform import Platform

logger = logging.getLogger("atomlite.dispatch")

BACKEND_PREFERENCES = ("auto", "triton", "torch")


class NoKernel(RuntimeError):
    """No backend serves an op on this platform (each backend's reason in the message)."""


@dataclass(frozen=True)
class KernelChoice:
    op: str
    backend: str
    reason: str
    fn: Callable | object  # the kernel; the MXFP4 ops' family object (see mxfp4_linear, mxfp4_moe)
    graph_unsafe_reason: str | None = None  # why a graph cannot capture fn; None when it can
    capabilities: frozenset[str] = frozenset()  # names from CAPABILITIES

    @property
    def graph_safe(self) -> bool:
        return self.graph_unsafe_reason is None

    def can(self, capability: str) -> bool:
        """Whether this kernel can do `capability` (a name from CAPABILITIES)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"{capability!r} is not a kernel capability; known: {', '.join(CAPABILITIES)}")
        return capability in self.capabilities


@dataclass
class KernelChoices:
    """The kernels one model's layers were given, by op and shape: each engine keeps its own (its startup report)."""
    made: dict[str, KernelChoice] = field(default_factory=dict)

    def record(self, key: str, choice: KernelChoice) -> None:
        if key not in self.made:
            self.made[key] = choice
            logger.info("kernel %s -> %s (%s)", key, choice.backend, choice.reason)

    def describe(self) -> list[str]:
        return [f"{key}: {c.backend} ({c.reason})" for key, c in sorted(self.made.items())]

    def graph_unsafe(self) -> dict[str, str]:
        """The chosen kernels a CUDA/HIP graph cannot capture, by key: "backend: why"."""
        return {key: f"{c.backend}: {c.graph_unsafe_reason}" for key, c in sorted(self.made.items())
                if not c.graph_safe}


@dataclass(frozen=True)
class Selector:
    platform: Platform = Platform()
    prefer: str = "auto"
    choices: KernelChoices | None = None


# Context-local, so that two engines built in different threads or tasks never see each other's selection.
_active: ContextVar[Selector] = ContextVar("atomlite_kernel_selector", default=Selector())


@contextlib.contextmanager
def use(platform: Platform, prefer: str = "auto", choices: KernelChoices | None = None):
    """Layers built inside this block pick kernels for `platform` under the given preference and record them in
    `choices` (a new KernelChoices unless given), which the block yields."""
    if prefer not in BACKEND_PREFERENCES:
        raise ValueError(f"kernel backend {prefer!r} is not one of {', '.join(BACKEND_PREFERENCES)}")
    choices = KernelChoices() if choices is None else choices
    token = _active.set(Selector(platform, prefer, choices))
    try:
        yield choices
    finally:
        _active.reset(token)


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
    """The kernel for `op` at `shape` under the active `use` block, recorded in its KernelChoices; with a platform or
    preference given, a what-if that records nothing."""
    active = _active.get()
    recorder = active.choices if platform is None and prefer is None else None
    platform = platform or active.platform
    prefer = prefer or active.prefer
    skipped = []
    for name, why in _candidates(platform, prefer):
        refusal = kernels.refusal(name, op, platform, shape)
        if refusal is not None:
            skipped.append(f"{name}: {refusal}")
            continue
        kernel = kernels.kernel(name, op)
        choice = KernelChoice(op, name, "; ".join([why] + skipped), kernel.fn, kernel.graph_unsafe,
                              kernel.capabilities)
        if recorder is not None:
            recorder.record(_choice_key(op, shape), choice)
        return choice
    raise NoKernel(f"no backend implements {op} here ({'; '.join(skipped)})")


def _choice_key(op: str, shape: dict) -> str:
    shape_text = ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return f"{op}[{shape_text}]" if shape_text else op
