"""The one table that decides which backend runs each op: aiter | triton | torch, and why.

Layers ask `choose(op, **shape)` once, at construction, and keep the function they get: the forward path never
branches on device. The `use` block they are built in names the platform and keeps what was chosen. Each backend
package exposes OPS (name -> function) and limits(op, platform, shape), which returns None when it can serve the
shape or a reason why not; GRAPH_UNSAFE (name -> why) for the functions a CUDA/HIP graph cannot capture (they
sync with the host); and DECLINED (name -> why) for ops it deliberately leaves to the next backend.
"""
import contextlib
import importlib
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

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
    """The kernel for `op` at `shape` under the active `use` block, recorded in its KernelChoices; with a platform or
    preference given, a what-if that records nothing."""
    active = _active.get()
    recorder = active.choices if platform is None and prefer is None else None
    platform = platform or active.platform
    prefer = prefer or active.prefer
    skipped = []
    for name, why in _candidates(platform, prefer):
        backend = _backend(name)
        fn = backend.OPS.get(op)
        if fn is None:
            skipped.append(f"{name}: {getattr(backend, 'DECLINED', {}).get(op) or f'no {op} kernel'}")
            continue
        refusal = backend.limits(op, platform, shape)
        if refusal is not None:
            skipped.append(f"{name}: {refusal}")
            continue
        unsafe = getattr(backend, "GRAPH_UNSAFE", {}).get(op)
        choice = KernelChoice(op, name, "; ".join([why] + skipped), fn, unsafe)
        if recorder is not None:
            recorder.record(_choice_key(op, shape), choice)
        return choice
    raise RuntimeError(f"no backend implements {op}")


def _choice_key(op: str, shape: dict) -> str:
    shape_text = ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return f"{op}[{shape_text}]" if shape_text else op
