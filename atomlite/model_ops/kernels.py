"""The kernel registry. Each kernel declares, next to its code (`declare(...)` at the end of its module), the op it
serves and on which backend, the shapes it refuses and why, what it can do beyond the op's plain contract (the
CAPABILITIES below, which model_ops.fusion reads to link one layer's kernel to the next), whether a CUDA/HIP graph
can capture it, and the module that holds its launch constants. A backend that deliberately leaves an op to the next
one says so with `decline(...)`. The ops themselves are declared once, in model_ops/ops.py.

model_ops.dispatch reads only this registry. A backend is a package (BACKEND_PACKAGES); its kernels are declared by
importing every module in it, the first time dispatch asks about that backend.
"""
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from atomlite.model_ops.ops import OPS
from atomlite.model_ops.platform import Platform

BACKEND_PACKAGES = {"aiter": "atomlite.model_ops.aiter", "triton": "atomlite.model_ops.triton",
                    "torch": "atomlite.model_ops.torch_ref"}

# What a kernel may take or give in place of a plain tensor (the forms are model_ops.carriers'), for
# model_ops.fusion; the writes_ forms of a pair, of gated input and of rank partials are done by layers
# (RMSNorm.joined, GeluTanhAndMul, sharding.ReducesOutput), no kernel declares them.
CAPABILITIES = {
    "reads_partial_sums": "takes a split-K GEMM's PartialSums for a tensor input and adds them as it reads them",
    "reads_normed_pair": "takes a NormedPair (two branches' output norms) for its input and joins them as it reads",
    "reads_quantized_rows": "takes its input as QuantizedRows that the kernel before it wrote (input_quantization)",
    "reads_token_rows": "takes its input as TokenRows (FP8 per token) that the kernel before it wrote",
    "reads_gated_input": "takes a GatedInput and computes gelu_tanh(gate) * up as it quantizes its input",
    "reads_rank_partials": "takes RankPartials (a NormedPair's sides too) and sums them over the tensor-parallel ranks "
                           "through peer memory as it reads them; with reads_partial_sums, a share that is itself "
                           "PartialSums too",
    "writes_partial_sums": "returns its split-K slices unsummed (PartialSums) when called with summed=False",
    "writes_quantized_rows": "writes its output as the QuantizedRows the GEMM after it asks for (quantize=)",
    "writes_token_rows": "writes its output as the TokenRows the GEMM after it asks for (quantize=)",
    "writes_normed_pair": "leaves two branches' output norms unjoined (NormedPair)",
    "writes_gated_input": "leaves [gate | up] for the GEMM after it to activate (GatedInput)",
    "writes_rank_partials": "leaves a row-parallel product's share unsummed over the ranks (RankPartials)",
    "graphs_multi_query": "replays from a graph steps of several queries per sequence (speculative decoding's "
                          "verify steps) without the host's lengths",
    "graphs_packed_sequences": "replays from a graph packs whose sequence bounds change from step to step (a vision "
                               "tower's images), reading them on the device alone",
}

Refusal = Callable[[Platform, dict], "str | None"]


@dataclass(frozen=True)
class Kernel:
    """One backend's kernel for one op, as its module declares it."""
    op: str
    backend: str
    fn: Callable | object  # the op's function; for the quantized ops (mxfp4_*, fp8_*) a family object
    refuses: Refusal | None = None  # (platform, shape) -> why it cannot serve that shape, or None
    capabilities: frozenset[str] = frozenset()  # names from CAPABILITIES
    graph_unsafe: str | None = None  # why a CUDA/HIP graph cannot capture fn (it syncs with the host); None: it can
    tuning: ModuleType | None = None  # the module with its launch constants and the timings that chose them
    requires: tuple[str, ...] = ()  # what the backend's library must provide (AITER: function paths)
    probe: Callable[[], "str | None"] | None = None  # on the machine itself, after `requires`: why it cannot run
    module: str = ""  # where it is declared


@dataclass(frozen=True)
class Backend:
    """What a backend checks around its kernels' own refusals: `unavailable(platform)` before the shape is looked
    at (Triton needs a GPU), `lacks(kernel, platform)` after the kernel took the shape (AITER: this AITER has not
    the functions the kernel requires)."""
    name: str
    unavailable: Callable[[Platform], "str | None"] = lambda platform: None
    lacks: Callable[[Kernel, Platform], "str | None"] = lambda kernel, platform: None


@dataclass
class _Registry:
    backends: dict[str, Backend] = field(default_factory=dict)
    kernels: dict[tuple[str, str], Kernel] = field(default_factory=dict)
    declined: dict[tuple[str, str], str] = field(default_factory=dict)
    loaded: set[str] = field(default_factory=set)


_registry = _Registry()


def _check_backend(backend: str) -> None:
    if backend not in BACKEND_PACKAGES:
        raise ValueError(f"{backend!r} is not a backend; known: {', '.join(BACKEND_PACKAGES)}")


def _check_names(op: str, backend: str, capabilities) -> None:
    if op not in OPS:
        raise ValueError(f"{op!r} is not an op; declare it in model_ops/ops.py (known: {', '.join(OPS)})")
    _check_backend(backend)
    unknown = set(capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"{op} on {backend}: {', '.join(sorted(unknown))} not kernel capabilities; known: "
                         f"{', '.join(CAPABILITIES)}")


def declare(op: str, backend: str, fn, *, refuses: Refusal | None = None, capabilities=(),
            graph_unsafe: str | None = None, tuning: ModuleType | None = None, requires: tuple[str, ...] = (),
            probe=None, module: str = "") -> Kernel:
    """Registers `fn` as `backend`'s kernel for `op` (one per op and backend)."""
    _check_names(op, backend, capabilities)
    kernel = Kernel(op, backend, fn, refuses, frozenset(capabilities), graph_unsafe, tuning, tuple(requires), probe,
                    module or getattr(fn, "__module__", ""))
    previous = _registry.kernels.get((backend, op))
    if previous is not None and previous.module != kernel.module:
        raise ValueError(f"{backend} has two {op} kernels: {previous.module} and {kernel.module}")
    _registry.kernels[(backend, op)] = kernel
    return kernel


def decline(op: str, backend: str, why: str) -> None:
    """`backend` has a kernel family for `op` that atomlite deliberately leaves to the next backend, and why."""
    _check_names(op, backend, ())
    _registry.declined[(backend, op)] = why


def declare_backend(backend: Backend) -> Backend:
    _check_backend(backend.name)
    _registry.backends[backend.name] = backend
    return backend


def _load(backend: str) -> None:
    """Imports every module of the backend's package, so that each declares its kernels."""
    if backend in _registry.loaded:
        return
    _check_backend(backend)
    package = importlib.import_module(BACKEND_PACKAGES[backend])
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        importlib.import_module(info.name)
    _registry.loaded.add(backend)


def kernel(backend: str, op: str) -> Kernel | None:
    """`backend`'s kernel for `op`, or None."""
    _load(backend)
    return _registry.kernels.get((backend, op))


def kernels_of(backend: str) -> dict[str, Kernel]:
    """Every kernel `backend` declares, by op."""
    _load(backend)
    return {op: k for (name, op), k in sorted(_registry.kernels.items()) if name == backend}


def declined(backend: str, op: str) -> str | None:
    _load(backend)
    return _registry.declined.get((backend, op))


def refusal(backend: str, op: str, platform: Platform, shape: dict) -> str | None:
    """None when `backend` serves `op` at `shape` on `platform`, else why not: no kernel (or declined), the backend
    is unavailable there, the kernel refuses the shape, or the backend's library lacks what the kernel requires."""
    found = kernel(backend, op)
    if found is None:
        return declined(backend, op) or f"no {op} kernel"
    checks = _registry.backends.get(backend, Backend(backend))
    return (checks.unavailable(platform) or (found.refuses and found.refuses(platform, shape))
            or checks.lacks(found, platform) or None)
