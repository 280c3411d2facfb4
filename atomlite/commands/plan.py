"""`atomlite plan`: what a checkpoint needs (KV groups, weights, sequences that fit, kernels), from config.json
alone."""
import click

from atomlite.commands.options import RUNTIME_ONLY, engine_args, engine_options, fail, model_dir, without_options
from atomlite.errors import ConfigError


@click.command()
@without_options(*RUNTIME_ONLY)
@engine_options
@click.option("--seq-len", type=int, default=None,
              help="Also say how many requests of this many tokens fit at once in the pool planned for "
                   "--max-model-len.")
@click.option("--platform", "platform_text", default=None,
              help="Plan for this platform instead of this machine: cpu, cuda, sm_90, rocm, gfx942, gfx950[+aiter].")
@click.option("--kernels", is_flag=True, help="List the kernel each op gets (aiter | triton | torch) and why.")
@click.option("--compile", "compile_kernels", is_flag=True,
              help="With --platform gfx942|gfx950|sm_XY: compile every Triton kernel specialization launched there "
                   "for --model (default: every config of examples/configs), no GPU needed, and print "
                   "registers, spills, LDS / shared memory and occupancy.")
def plan(seq_len, platform_text, kernels, compile_kernels, **kw):
    """Print KV groups, bytes per token, weight bytes and how many sequences fit, from config.json alone."""
    from atomlite.config import EngineConfig, parse_memory_size
    from atomlite.model_ops.dispatch import KernelChoices
    from atomlite.model_ops.platform import detect_platform, parse_platform
    from atomlite.plan import compile_report, plan_report
    try:
        args = engine_args(kw)
        budget = parse_memory_size(args.pop("kv_cache_memory") or "20GiB")
        if args["device"] == "auto":
            args["device"] = "cpu"  # the model is built on meta: planning -tp 8 needs none of this machine's GPUs
        platform = parse_platform(platform_text) if platform_text else None
        if platform is not None and args.get("block_size") is None:
            args["block_size"] = platform.block_size  # the blocks the engine would take there
        config = EngineConfig(model=model_dir(kw), **args)
        platform = platform or detect_platform(config.torch_device)
        choices = KernelChoices()
        lines, _ = plan_report(config, budget, platform, choices, seq_len)
        if kernels:
            lines.append(f"kernels of this model on {platform.describe()}:")
            lines += [f"  {line}" for line in choices.describe()]
        if compile_kernels:
            lines += compile_report(platform_text, kw["model"])
    except (ConfigError, ValueError, RuntimeError) as e:
        fail(str(e))
    click.echo("\n".join(lines))
