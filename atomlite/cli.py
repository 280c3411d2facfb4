"""The `atomlite` command: generate, plan (serve, bench and eval come with their issues)."""
import logging
import sys

import click

from atomlite.errors import ConfigError

ENGINE_OPTIONS = [
    click.option("--model", "model", required=True, type=click.Path(), help="Checkpoint folder (config.json + *.safetensors)."),
    click.option("--dtype", default="auto", type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
                 show_default=True, help="Weights and activations dtype; auto = the checkpoint's."),
    click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda (ROCm GPUs are cuda in torch)."),
    click.option("--max-model-len", type=int, default=None, help="Context length (prompt + output); default min(model limit, 8192)."),
    click.option("--max-num-seqs", type=int, default=64, show_default=True, help="Most sequences in one batch."),
    click.option("--max-num-batched-tokens", type=int, default=2048, show_default=True, help="Token budget of one step (prefill chunk size)."),
    click.option("--kv-cache-memory", default=None, help="KV cache budget, e.g. 20GiB (default: what fits; 2GiB cap on CPU)."),
    click.option("--block-size", type=int, default=16, show_default=True, help="Tokens per KV block."),
    click.option("--kernel-backend", default="auto", type=click.Choice(["auto", "triton", "torch"]),
                 show_default=True, help="Kernel choice: auto = aiter > triton > torch by platform and shape."),
    click.option("--no-prefix-caching", is_flag=True, help="Disable reuse of cached prompt prefixes."),
]


def engine_options(fn):
    for option in reversed(ENGINE_OPTIONS):
        fn = option(fn)
    return fn


def engine_args(kw: dict) -> dict:
    keys = ("dtype", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory",
            "block_size", "kernel_backend")
    args = {k: kw[k] for k in keys}
    args["enable_prefix_caching"] = not kw["no_prefix_caching"]
    return args


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log kernel choices and engine details.")
def main(verbose: bool):
    """atomlite: a small, fast, ROCm-first LLM inference runtime."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


@main.command()
@engine_options
@click.argument("prompts", nargs=-1, required=True)
@click.option("--max-tokens", type=int, default=32, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=-1, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
def generate(prompts, max_tokens, temperature, top_p, top_k, seed, stop, **kw):
    """Generate a completion for each PROMPT."""
    from atomlite import LLM, SamplingParams
    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                                seed=seed, stop=list(stop))
        llm = LLM(kw["model"], **engine_args(kw))
        outputs = llm.generate(list(prompts), params)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        click.echo(f"--- {prompt!r} ({len(completion.token_ids)} tokens, {completion.finish_reason})")
        click.echo(prompt + completion.text)


@main.command()
@engine_options
@click.option("--seq-len", type=int, default=None, help="Sequence length to count fitting sequences for (default: --max-model-len).")
def plan(seq_len, **kw):
    """Print KV groups, bytes per token, weight bytes and how many sequences fit, from config.json alone."""
    from atomlite.config import EngineConfig, parse_memory_size
    from atomlite.model_ops.platform import detect_platform
    from atomlite.plan import plan_report
    import torch
    try:
        args = engine_args(kw)
        budget = parse_memory_size(args.pop("kv_cache_memory") or "20GiB")
        if seq_len is not None:
            args["max_model_len"] = seq_len
        config = EngineConfig(model=kw["model"], **args)
        device = config.torch_device if config.device != "auto" else torch.device("cpu")
        lines, _ = plan_report(config, budget, detect_platform(device))
    except (ConfigError, ValueError) as e:
        fail(str(e))
    click.echo("\n".join(lines))


if __name__ == "__main__":
    main()
