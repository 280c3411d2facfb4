"""What every kernel launcher needs: interpreter detection and the dtype rules that go with it."""
import functools

import torch
import triton


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1, where bf16 arithmetic is wrong: kernels upcast right after loading."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    import os
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dot_precision(dtype: torch.dtype) -> str | None:
    # fp32 inputs would otherwise go through tf32 on the tensor cores; fp32 is the exactness path, keep it exact.
    return "ieee" if dtype == torch.float32 else None


@functools.cache
def multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return multiprocessor_count(device.index if device.index is not None else torch.cuda.current_device())
