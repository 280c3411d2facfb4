"""Adapter over AMD's AITER kernels (ROCm only; imported lazily). No adapters yet: every op falls through."""
OPS: dict = {}


def limits(op: str, platform, shape: dict) -> str | None:
    return "not implemented"
