"""The one table that decides which backend runs each op: aiter | triton | torch, and why.

Layers ask `choose(op, **shape)` once, at construction, and keep the function they get: the forward path never
branches on device. The `use` block they are built in names the platform and keeps what was chosen. Each backend
package exposes OPS (name -> function; for mxfp4_linear and mxfp4_moe_experts a family object that also prepares
the weights at load) and limits(op, platform, shape), which returns None when it can serve the shape or a reason why
not; GRAPH_UNSAFE (name -> why) for the functions a CUDA/HIP graph cannot capture (they sync with the host);
DECLINED (name -> why) for ops it deliberately leaves to the next backend; and CAPABILITIES (name -> what its kernel
can do beyond the op's plain contract, names from CAPABILITIES below), which model_ops.fusion reads to link one
layer's kernel to the next.
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

# What a kernel may take or give in place of a plain tensor (the forms are model_ops.carriers'), for
# model_ops.fusion; the writes_ forms of a pair, of gated input and of rank partials are done by layers
# (RMSNorm.joined, GeluTanhAndMul, sharding.ReducesOutput), no kernel declares them.
CAPABILITIES = {
    "reads_partial_sums": "takes a split-K GEMM's PartialSums for a tensor input and adds them as it reads them",
    "reads_normed_pair": "takes a NormedPair (two branches' output norms) for its input and joins them as it reads",
    "reads_quantized_rows": "takes its input as QuantizedRows that the kernel before it wrote (input_quantization)",
    "reads_gated_input": "takes a GatedInput and computes gelu_tanh(gate) * up as it quantizes its input",
    "reads_rank_partials": "takes RankPartials (a NormedPair's sides too) and sums them over the tensor-parallel ranks "
                           "through peer memory as it reads them",
    "writes_partial_sums": "returns its split-K slices unsummed (PartialSums) when called with summed=False",
    "writes_quantized_rows": "writes its output as the QuantizedRows the GEMM after it asks for (quantize=)",
    "writes_normed_pair": "leaves two branches' output norms unjoined (NormedPair)",
    "writes_gated_input": "leaves [gate | up] for the GEMM after it to activate (GatedInput)",
    "writes_rank_partials": "leaves a row-parallel product's share unsummed over the ranks (RankPartials)",
    "graphs_multi_query": "replays from a graph steps of several queries per sequence (speculative decoding's "
                          "verify steps) without the host's lengths",
    "graphs_packed_sequences": "replays from a graph packs whose sequence bounds change from step to step (a vision "
                               "tower's images), reading them on the device alone",
}


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
        capabilities = frozenset(getattr(backend, "CAPABILITIES", {}).get(op, ()))
        choice = KernelChoice(op, name, "; ".join([why] + skipped), fn, unsafe, capabilities)
        if recorder is not None:
            recorder.record(_choice_key(op, shape), choice)
        return choice
    raise NoKernel(f"no backend implements {op} here ({'; '.join(skipped)})")


def _choice_key(op: str, shape: dict) -> str:
    shape_text = ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return f"{op}[{shape_text}]" if shape_text else op
