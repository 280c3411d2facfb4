"""What the commands share: the engine options, turning them into EngineConfig's arguments, the one-line error,
and -v on every command."""
import logging
import sys
from pathlib import Path

import click

from atomlite.errors import ConfigError

ENGINE_OPTIONS = [
    click.option("--model", "model", default=None, type=click.Path(),
                 help="Checkpoint folder (config.json + *.safetensors) or Hugging Face hub repo id (org/name); "
                      "default: the bundled demo model."),
    click.option("--dtype", default="auto",
                 type=click.Choice(["auto", "float32", "bfloat16", "float16", "half", "float"]),
                 show_default=True, help="Weights and activations dtype; auto = the checkpoint's (half = float16, "
                                         "float = float32, as vLLM)."),
    click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda (ROCm GPUs are cuda in torch)."),
    click.option("--max-model-len", type=int, default=None, help="Context length (prompt + output); default min(model limit, 8192)."),
    click.option("--max-num-seqs", type=int, default=64, show_default=True, help="Most sequences in one batch."),
    click.option("--max-num-batched-tokens", type=int, default=2048, show_default=True, help="Token budget of one step (prefill chunk size)."),
    click.option("--max-num-encoder-input-tokens", type=int, default=None,
                 help="Soft tokens the vision tower may encode in one step (default: --max-num-batched-tokens)."),
    click.option("--encoder-cache-memory", default=None,
                 help="Bound of the cache of encoded images, e.g. 512MiB (default: the larger of the encoder budget "
                      "and one 1120-token image, in soft tokens of the model's width)."),
    click.option("--kv-cache-memory", default=None, help="KV cache budget, e.g. 20GiB (default: what fits; 2GiB cap on CPU)."),
    click.option("--block-size", type=int, default=None,
                 help="Tokens per KV block (default: 64 on NVIDIA GPUs, 16 on ROCm and the CPU)."),
    click.option("--kernel-backend", default="auto", type=click.Choice(["auto", "triton", "torch"]),
                 show_default=True, help="Kernel choice: auto = aiter > triton > torch by platform and shape."),
    click.option("--enable-prefix-caching/--no-enable-prefix-caching", " /--no-prefix-caching", "enable_prefix_caching",
                 default=True, help="Reuse cached prompt prefixes (on by default; --no-prefix-caching is "
                                    "--no-enable-prefix-caching)."),
    click.option("--load-format", default="auto", type=click.Choice(["auto", "dummy"]), show_default=True,
                 help="auto: the checkpoint's safetensors; dummy: seeded random weights from config.json alone."),
    click.option("--enforce-eager", is_flag=True,
                 help="Never replay steps or the vision and audio towers from CUDA/HIP graphs."),
    click.option("--compilation-config", default=None,
                 help='vLLM\'s JSON; atomlite honours its cudagraph_mode: FULL_AND_PIECEWISE (the default), FULL '
                      'or PIECEWISE replay decode steps and prefill/mixed steps (per token bucket) from graphs, '
                      'FULL_DECODE_ONLY decode steps alone, NONE none (as --enforce-eager).'),
    click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True,
                 help="Share of the GPU's memory atomlite may use (weights, activations, graphs, KV cache); "
                      "the KV cache gets what a profiling run leaves. --kv-cache-memory overrides it."),
    click.option("--max-graph-batch", type=int, default=None,
                 help="Largest decode batch captured in a graph (default: --max-num-seqs)."),
    click.option("--no-overlap-decode", is_flag=True,
                 help="Read each decode step's tokens before launching the next. By default, when the next step "
                      "can only be the same sequences decoding, it is launched first, its input ids taken on the "
                      "GPU, so the host's per-step work runs beside it (graph-replayed steps only)."),
    click.option("--kv-cache-dtype", default="auto", type=click.Choice(["auto", "bfloat16", "float16", "fp8"]),
                 show_default=True, help="What the KV cache stores: auto = --dtype, or fp8 for a checkpoint "
                                         "quantized for an fp8 KV cache (Quark); fp8 = e4m3 (e4m3fnuz on gfx942), "
                                         "half the bytes of bf16, with the checkpoint's per-layer scales where "
                                         "they describe the cache, else 1."),
    click.option("--tensor-parallel-size", "-tp", "tensor_parallel_size", type=int, default=1, show_default=True,
                 help="Processes, one per GPU, that each hold a shard of every layer; atomlite starts them itself "
                      "(on CPU they join over gloo)."),
    click.option("--disable-custom-all-reduce", is_flag=True,
                 help="Under tensor parallelism, all-reduce through the collective library (NCCL/RCCL) alone. By "
                      "default a decode graph's small all-reduces run over peer memory where the GPUs can read each "
                      "other's: atomlite's one-shot kernel on NVIDIA, AITER's custom all-reduce on ROCm."),
    click.option("--cpu-threads", type=int, default=None,
                 help="torch CPU threads of the engine (default: usable cores but one; else OMP_NUM_THREADS)."),
    click.option("--scheduling-policy", default="fcfs", type=click.Choice(["fcfs", "priority"]), show_default=True,
                 help="fcfs: requests run in arrival order; priority: by each request's `priority` field (lower "
                      "first, ties by arrival), and the latest of the lowest priority is preempted first."),
    click.option("--speculative-config", default=None,
                 help='Speculative decoding, as JSON in vLLM\'s names: {"method": "mtp", "model": ASSISTANT_DIR, '
                      '"num_speculative_tokens": 4} (a Gemma 4 assistant) or {"method": "ngram", '
                      '"num_speculative_tokens": 4, "prompt_lookup_max": 5} (drafts from the prompt).'),
]


def engine_options(fn):
    for option in reversed(ENGINE_OPTIONS):
        fn = option(fn)
    return fn


# engine flags that change how steps run, not the KV plan
RUNTIME_ONLY = ("load_format", "enforce_eager", "compilation_config", "gpu_memory_utilization", "max_graph_batch",
                "no_overlap_decode", "enable_prefix_caching", "speculative_config", "disable_custom_all_reduce",
                "scheduling_policy", "max_num_encoder_input_tokens", "encoder_cache_memory")


def without_options(*names: str):
    """Drops engine options a command has no use for (so its --help does not list them)."""
    def decorate(fn):
        fn.__click_params__ = [p for p in fn.__click_params__ if p.name not in names]
        return fn
    return decorate


def model_dir(kw: dict) -> str:
    return str(kw["model"] or default_model())


def engine_args(kw: dict) -> dict:
    keys = ("dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory",
            "block_size", "kernel_backend", "load_format", "enforce_eager", "max_graph_batch", "gpu_memory_utilization",
            "kv_cache_dtype", "speculative_config", "tensor_parallel_size", "disable_custom_all_reduce",
            "scheduling_policy", "limit_mm_per_prompt", "mm_processor_kwargs", "allowed_local_media_path",
            "allowed_media_domains", "max_num_encoder_input_tokens", "encoder_cache_memory", "enable_prefix_caching",
            "seed", "tokenizer", "quantization", "generation_config", "override_generation_config", "cpu_threads",
            "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "compilation_config")
    args = {k: kw[k] for k in keys if k in kw}  # a command without some flag keeps EngineConfig's default
    if "no_overlap_decode" in kw:
        args["overlap_decode"] = not kw["no_overlap_decode"]
    return args


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _log_verbosely(ctx, param, verbose: bool) -> None:
    if verbose:
        logging.getLogger().setLevel(logging.INFO)


def verbose_option() -> click.Option:
    return click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_log_verbosely,
                        help="Log kernel choices and engine details.")


class VerboseGroup(click.Group):
    """A group whose commands (and subgroups' commands) all take -v, before or after the command's name."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.append(verbose_option())
        super().add_command(cmd, name)


def default_model() -> Path:
    from atomlite.demo import demo_model_dir
    try:
        return demo_model_dir()
    except ConfigError as e:
        fail(str(e))
