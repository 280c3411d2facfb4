"""What every kernel launcher needs: interpreter detection, the dtype rules that go with it, the platform the kernels
are built for, and the one place where kernels are launched (which the compile gate records instead)."""
import contextlib
import functools
import os
from dataclasses import dataclass, field

import torch
import triton

from atomlite.model_ops.platform import Platform, detect_platform

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without griddepcontrol: no dependent launch (called only with PDL)
    gdc_launch_dependents = gdc_wait = None


def dependent_launches(device: torch.device) -> bool:
    """Whether kernels on device may be programmatic dependent launches: griddepcontrol, NVIDIA sm_90+, unless
    ATOMLITE_PDL=0 (every kernel then waits for the one ahead to end before it starts)."""
    return gdc_wait is not None and os.environ.get("ATOMLITE_PDL", "1") != "0" and nvidia_capability(device) >= (9, 0)


def pdl_launch(pdl: bool) -> dict:
    """run_kernel's option for a programmatic dependent launch (sm_90): the kernel's programs may start before the
    kernel ahead of it ends, so it must gdc_wait before reading what that kernel wrote."""
    return {"launch_pdl": True} if pdl else {}


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1, where bf16 arithmetic is wrong: kernels upcast right after loading."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def dot_precision(dtype: torch.dtype) -> str | None:
    # fp32 inputs would otherwise go through tf32 on the tensor cores; fp32 is the exactness path, keep it exact.
    return "ieee" if dtype == torch.float32 else None


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch as a launcher makes it: what compile_gate compiles for another target."""
    kernel: object  # the @triton.jit function
    grid: tuple
    args: tuple
    kwargs: dict


@dataclass
class _Recording:
    platform: Platform
    launches: list[KernelLaunch] = field(default_factory=list)


_recording: _Recording | None = None


@contextlib.contextmanager
def recording(platform: Platform):
    """Launchers called inside this block (on meta tensors) decide as on `platform` and record their launches
    instead of running them."""
    global _recording
    previous, _recording = _recording, _Recording(platform)
    try:
        yield _recording.launches
    finally:
        _recording = previous


def run_kernel(kernel, grid: tuple, *args, **kwargs) -> None:
    if _recording is not None:
        _recording.launches.append(KernelLaunch(kernel, tuple(grid), args, kwargs))
        return
    kernel[grid](*args, **kwargs)


@functools.cache
def _detected(device: torch.device) -> Platform:
    return detect_platform(device)


def platform_of(device: torch.device) -> Platform:
    """The platform kernels on `device` are built for (the recorded target inside `recording`)."""
    if _recording is not None:
        return _recording.platform
    return _detected(device)


def nvidia_capability(device: torch.device) -> tuple[int, int]:
    """The NVIDIA compute capability kernels on `device` are built for; (0, 0) off NVIDIA GPUs."""
    return capability_of(platform_of(device))


def fp8_cast_rounds(device: torch.device) -> bool:
    """Whether a kernel's fp32 -> e4m3fn cast on `device` rounds half to even itself (sm_89+: cvt.rn.satfinite), so
    that values need not be rounded onto the grid before it; not in the interpreter, whose cast rounds wrongly."""
    return not interpreting() and nvidia_capability(device) >= (8, 9)


def capability_of(platform: Platform) -> tuple[int, int]:
    """platform's NVIDIA compute capability; (0, 0) for other platforms."""
    if platform.kind != "cuda" or not platform.arch:
        return (0, 0)
    digits = platform.arch.removeprefix("sm_")
    return int(digits[:-1]), int(digits[-1])


@functools.cache
def multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# SMs or CUs of the GPUs the compile gate targets: H100/H200, MI300X, MI355X.
MULTIPROCESSORS = {"sm_90": 132, "gfx942": 304, "gfx950": 256}


def num_sms(device: torch.device) -> int:
    if _recording is not None:
        return MULTIPROCESSORS.get(_recording.platform.arch, 132)
    if device.type != "cuda":
        return 132
    return multiprocessor_count(device.index if device.index is not None else torch.cuda.current_device())


def cache_max(cache: torch.Tensor | None) -> float:
    """The largest value an fp8 cache holds (writes clamp to it, as a saturating conversion would); 0: no clamp."""
    if cache is None or cache.element_size() != 1:
        return 0.0
    return float(torch.finfo(cache.dtype).max)
