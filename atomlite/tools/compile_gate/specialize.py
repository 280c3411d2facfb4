"""A recorded launch as Triton would specialize it for a target: signature, constexprs and argument attributes
(divisibility, ints equal to 1, buffer-op pointer ranges) by Triton's own binder, built for the target's backend
instead of the local driver's."""
import json
from dataclasses import dataclass

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from atomlite.model_ops.platform import Platform
from atomlite.model_ops.triton.common import KernelLaunch


def gpu_target(platform: Platform) -> GPUTarget:
    """gfx942 / gfx950 (wave64) or sm_XY (warp 32)."""
    if platform.kind == "rocm" and platform.arch:
        return GPUTarget("hip", platform.arch, 64)
    if platform.kind == "cuda" and platform.arch:
        return GPUTarget("cuda", int(platform.arch.removeprefix("sm_")), 32)
    raise ValueError(f"compile gate targets gfxNNN or sm_XY, not {platform.describe()}")


@dataclass
class Specialization:
    kernel: str  # module.function of the @triton.jit kernel
    constexprs: dict  # name -> value as the launcher passed them; 'name==': a runtime int Triton fixed at 1
    options: dict  # num_warps, num_stages and the other backend options the launcher set
    workload: str  # the first workload that launched it
    source: ASTSource
    key: str

    def describe(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        tuning = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.kernel}[{values}; {tuning}]"


def _kernel_name(kernel) -> str:
    """family.module.function for atomlite's kernels (e.g. mxfp4.gemm._mxfp4_gemm_kernel); module.function else."""
    return f"{kernel.module.removeprefix('atomlite.model_ops.triton.')}.{kernel.fn.__name__}"


def specialize(workload: str, launch: KernelLaunch, target: GPUTarget) -> tuple[Specialization, dict]:
    """(specialization, options for triton.compile)."""
    kernel, backend = launch.kernel, make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, launch.kwargs, bound, specialization, options)
    declared = {kernel.arg_names[i] for i in kernel.constexprs}
    readable = {kernel.arg_names[path[0]]: getattr(value, "value", value) for path, value in constexprs.items()}
    readable = {name: value for name, value in readable.items() if name in declared} | {
        f"{name}==": value for name, value in readable.items() if name not in declared}  # ints fixed at 1
    set_options = {k: v for k, v in launch.kwargs.items() if k not in kernel.arg_names}
    key = json.dumps([_kernel_name(kernel), signature, sorted(map(str, readable.items())),
                      sorted(map(str, attrs.items())), sorted(map(str, options.__dict__.items()))])
    source = ASTSource(kernel, signature, constexprs, attrs)
    return Specialization(_kernel_name(kernel), readable, set_options, workload, source, key), options.__dict__


def _fingerprint(value):
    """What Triton's binder reads of a launch argument: a tensor's dtype, alignment and storage size (AMD's buffer ops
    ask whether it is within 2 GiB), a scalar's value; launches with equal fingerprints specialize alike."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.data_ptr() % 16, value.untyped_storage().size())
    if isinstance(value, (tuple, list)):
        return tuple(map(_fingerprint, value))
    return (type(value).__name__, repr(value))


def unique(launches: list[tuple[str, KernelLaunch]], target: GPUTarget) -> list[tuple[Specialization, dict]]:
    """One entry per distinct specialization, in first-launch order."""
    seen, fingerprints = {}, set()
    for workload, launch in launches:
        fingerprint = (id(launch.kernel), _fingerprint(launch.args), _fingerprint(sorted(launch.kwargs.items())))
        if fingerprint in fingerprints:
            continue
        fingerprints.add(fingerprint)
        spec, options = specialize(workload, launch, target)
        seen.setdefault(spec.key, (spec, options))
    return list(seen.values())
