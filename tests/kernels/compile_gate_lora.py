"""The compile gate's LoRA launches alone: what Gemma-4-31B's and 26B-A4B's configs launch with --enable-lora
(tests/kernels/test_lora_kernels.py compiles them for gfx942 and gfx950)."""
from atomlite.tools.compile_gate.recording import example_configs, record


def launches(platform):
    models = [path for path in example_configs() if path.name in ("gemma-4-31B-it", "gemma-4-26B-A4B-it")]
    return [(workload, launch) for workload, launch in record(platform, models)
            if launch.kernel.fn.__module__.startswith("atomlite.model_ops.triton.lora.")]
