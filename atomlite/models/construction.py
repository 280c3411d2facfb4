"""Building a model's modules: the dtype their parameters are made in."""
import contextlib

import torch


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Parameters made inside the block are of dtype (torch's default dtype, restored after)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
