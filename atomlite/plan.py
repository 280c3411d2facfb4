"""`atomlite plan`: what a checkpoint will need, from config.json alone (the model is built on the meta device)."""
from atomlite.config import EngineConfig
from atomlite.engine.kv_planner import KVPlan, plan_kv_cache
from atomlite.engine.llm_engine import construct_model
from atomlite.model_ops.dispatch import KernelChoices
from atomlite.model_ops.platform import Platform


def meta_model(config: EngineConfig, platform: Platform, kernels: KernelChoices | None = None):
    return construct_model(config, "meta", platform, kernels)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def plan_report(config: EngineConfig, budget: int, platform: Platform,
                kernels: KernelChoices | None = None) -> tuple[list[str], KVPlan]:
    """What the checkpoint needs under budget; the kernels its layers get on platform are recorded in `kernels`."""
    model = meta_model(config, platform, kernels)
    plan = plan_kv_cache(model.kv_specs(config.kv_dtype(platform)), budget, config.block_size, config.max_model_len)
    spec = config.model_spec
    lines = [f"model: {spec.path} ({spec.architecture}{', text part of a multimodal checkpoint' if spec.multimodal else ''})",
             f"layers: {len(spec.layers)}, dtype {str(config.torch_dtype).removeprefix('torch.')}, "
             f"weights {weight_bytes(model) / 2**30:.2f} GiB",
             f"max model len: {config.max_model_len}"]
    specs = model.kv_specs(config.kv_dtype(platform))
    shared = sum(s.kind == "shared" for s in specs)
    if shared:
        lines.append(f"KV sharing: {shared} layers reuse an earlier layer's K/V and own no cache")
    lines += plan.describe()
    return lines, plan
