"""The compile gate's FP8 launches alone (tests/kernels/test_fp8_gemm.py compiles them for gfx942 and gfx950)."""
from atomlite.tools.compile_gate.workloads import EXAMPLE_CONFIGS, gemma4_launches


def launches(platform):
    models = [EXAMPLE_CONFIGS / "gemma-4-31B-it", EXAMPLE_CONFIGS / "gemma-4-26B-A4B-it"]
    return [(workload, launch) for workload, launch in gemma4_launches(platform, models) if " fp8_" in workload]
