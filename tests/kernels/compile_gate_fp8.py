"""The compile gate's FP8 launches alone: the FP8 configs' recorded launches of the fp8 kernels
(tests/kernels/test_fp8_gemm.py compiles them for gfx942 and gfx950)."""
from atomlite.tools.compile_gate.recording import example_configs, record


def launches(platform):
    models = [path for path in example_configs() if "fp8" in path.name]
    return [(workload, launch) for workload, launch in record(platform, models)
            if launch.kernel.fn.__module__.startswith("atomlite.model_ops.triton.fp8.")]
