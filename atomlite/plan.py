"""`atomlite plan`: what a checkpoint will need, from config.json alone (the model is built on the meta device)."""
from atomlite import distributed
from atomlite.config import EngineConfig
from atomlite.distributed import TensorParallel
from atomlite.engine.kv.kv_planner import KVPlan, plan_kv_cache
from atomlite.engine.llm_engine import construct_model
from atomlite.model_ops import dispatch
from atomlite.model_ops.dispatch import KernelChoices
from atomlite.model_ops.mxfp4_linear import row_copy_plan_line
from atomlite.model_ops.platform import Platform, parse_platform


def meta_model(config: EngineConfig, platform: Platform, kernels: KernelChoices | None = None, rank: int = 0):
    """The model as rank builds it under config.tensor_parallel_size (the whole model at size 1)."""
    # size > 1 with no process group runs no collective at construction, so any rank builds in this one process
    with distributed.use(TensorParallel(rank, config.tensor_parallel_size)):
        return construct_model(config, "meta", platform, kernels)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def plan_report(config: EngineConfig, budget: int, platform: Platform, kernels: KernelChoices | None = None,
                seq_len: int | None = None) -> tuple[list[str], KVPlan]:
    """What the checkpoint needs under budget (per rank under tensor parallelism: ranks hold equal shards, so rank
    0's numbers hold for every rank), and how many requests of seq_len tokens fit; the kernels its layers get on
    platform are recorded in `kernels`."""
    model = meta_model(config, platform, kernels)
    specs = model.kv_specs(config.kv_dtype(platform))
    plan = plan_kv_cache(specs, budget, config.block_size, config.max_model_len)
    spec = config.model_spec
    part = ", text model and vision tower" if spec.vision else ", text part" if spec.multimodal else ""
    whole = " of a multimodal checkpoint" if spec.multimodal else ""
    if spec.multimodal and not spec.vision and not any(config.limit_mm_per_prompt.values()):
        whole += "; its vision tower is not loaded: --limit-mm-per-prompt allows no image or video"
    lines = [f"model: {spec.path} ({spec.architecture}{part}{whole})"]
    lines += tensor_parallel_lines(config.tensor_parallel_size)
    lines += all_reduce_lines(config, platform)
    lines += [f"layers: {len(spec.layers)}, dtype {str(config.torch_dtype).removeprefix('torch.')}, "
              f"{weights_text(weight_bytes(model), config.tensor_parallel_size)}",
              f"max model len: {config.max_model_len}"]
    from atomlite.model_ops.fp8_linear import fp8_note
    note = fp8_note(model, platform)
    lines += [note] if note else []
    copies = row_copy_plan_line(model, platform)
    lines += [copies] if copies else []
    shared = sum(s.kind == "shared" for s in specs)
    if shared:
        lines.append(f"KV sharing: {shared} layers reuse an earlier layer's K/V and own no cache")
    lines += plan.describe(seq_len)
    return lines, plan


def tensor_parallel_lines(size: int) -> list[str]:
    if size == 1:
        return []
    return [f"tensor parallel: {size} ranks; weights and KV cache below are each rank's "
            f"(--kv-cache-memory is per rank, one GPU each)"]


def all_reduce_lines(config: EngineConfig, platform: Platform) -> list[str]:
    """Which all-reduce the group would use on platform (the engine also checks that its GPUs reach each other's
    memory)."""
    if config.tensor_parallel_size == 1:
        return []
    library = "gloo" if not platform.is_gpu else "rccl" if platform.kind == "rocm" else "nccl"
    try:
        choice = dispatch.choose("custom_all_reduce", platform, config.kernel_backend,
                                 world=config.tensor_parallel_size)
    except dispatch.NoKernel as e:
        return [f"all-reduce: {library} alone ({e})"]
    return [f"all-reduce: {choice.backend} custom all-reduce in graphs ({choice.reason}), {library} otherwise"]


def weights_text(rank_bytes: int, size: int) -> str:
    if size == 1:
        return f"weights {rank_bytes / 2**30:.2f} GiB"
    return f"weights {rank_bytes / 2**30:.2f} GiB per rank ({size * rank_bytes / 2**30:.2f} GiB in all)"


def compile_report(platform_text: str | None, model: str | None) -> list[str]:
    """`plan --compile`: every Triton specialization model launches on platform_text, compiled without a GPU."""
    from atomlite.tools.compile_gate import failures, run_gate
    from atomlite.tools.compile_gate.report import LEGEND, format_table
    from atomlite.tools.compile_gate.specialize import gpu_target
    if not platform_text:
        raise ValueError("--compile needs --platform gfx942, gfx950 or sm_XY")
    gpu_target(parse_platform(platform_text))  # a platform without an architecture fails here, in one line
    run = run_gate([platform_text], [model] if model else [])
    lines = [f"Triton kernels compiled for {platform_text} ({len(run.results)} specializations; {LEGEND}):"]
    lines += format_table(run.results)
    broken = failures(run)
    if broken:
        lines += [f"{len(broken)} failed to compile:"] + broken
    return lines
