"""`atomlite bench`: latency, throughput and speculative decoding of the engine in this process, and a running
server's speed, each beside its roofline."""
import time
from pathlib import Path

import click

from atomlite.commands.options import (VerboseGroup, default_model, engine_args, engine_options, fail,
                                       model_dir)
from atomlite.errors import ConfigError


@click.group(cls=VerboseGroup)
def bench():
    """Benchmarks, each printed beside its roofline (rates probed on this device in the same run)."""


def _bench_engine(kw: dict):
    """The engine of an in-process bench, which then runs as `serve`'s engine core does: its startup heap frozen."""
    from atomlite.config import EngineConfig
    from atomlite.engine.llm_engine import LLMEngine
    from atomlite.heap import freeze_startup_heap
    try:
        engine = LLMEngine(EngineConfig(model=model_dir(kw), **engine_args(kw)))
    except (ConfigError, ValueError) as e:
        fail(str(e))
    freeze_startup_heap()
    return engine


def _rate(per_second: float, unit: str) -> str:
    """In the largest unit that keeps it at 1 or more: 2.97 TB/s on a GPU, 8.4 GB/s on a CPU."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if per_second >= scale:
            return f"{per_second / scale:.2f} {prefix}{unit}"
    return f"{per_second:.0f} {unit}"


def _bench_report(engine, kind: str, rows: list[dict], probes, settings: dict, json_path) -> None:
    from atomlite.benchmarks.offline import format_table
    from atomlite.benchmarks.report import device_name, write_json
    spec = engine.config.model_spec
    header = [f"device: {device_name(engine.device)}; model: {spec.path} ({len(spec.layers)} layers, "
              f"dtype {str(engine.config.torch_dtype).removeprefix('torch.')}, load format "
              f"{engine.config.load_format})",
              *([f"tensor parallel: {engine.workers.tp.size} ranks; {engine.all_reduce_note}"]
                if engine.workers is not None else []),
              engine.graph_note, f"CPU threads: {engine.threads_note}",
              *([engine.warmup_note] if engine.warmup_note else []),
              *([engine.memory.describe()] if engine.memory is not None else []),
              f"probes: copy {_rate(probes.copy_bytes_per_s, 'B/s')} (read + write), "
              f"GEMM {_rate(probes.gemm_flops_per_s, 'FLOP/s')}"]
    click.echo("\n".join(header + format_table(rows)))
    write_json(json_path, {"benchmark": kind, "device": device_name(engine.device), "model": str(spec.path),
                           "engine": {k: str(v) for k, v in vars(engine.config).items() if k != "model_spec"},
                           "graphs": engine.graph_note, "probes": probes.as_dict(), "settings": settings,
                           "results": rows})


BENCH_JSON = click.option("--json", "--result-filename", "json_path", type=click.Path(path_type=Path), default=None,
                          help="Also write the results to this JSON file (--result-filename: vLLM's name).")


@bench.command()
@engine_options
@click.option("--input-len", type=int, default=512, show_default=True, help="Prompt tokens.")
@click.option("--output-len", type=int, default=128, show_default=True, help="Tokens generated per sequence.")
@click.option("--batch-size", type=int, default=16, show_default=True, help="Batch for the second TPOT row.")
@click.option("--repeats", "--num-iters", "repeats", type=int, default=5, show_default=True,
              help="TTFT runs (median); --num-iters is vLLM's name.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts.")
@click.option("--images-per-prompt", type=int, default=0, show_default=True,
              help="Synthetic images (seeded random pixels) before each TTFT prompt's --input-len text tokens: its "
                   "TTFT against a text-only prompt of as many tokens, and the vision tower alone in images/s.")
@click.option("--image-size", default="896x896", show_default=True,
              help="WIDTHxHEIGHT of each synthetic image, before the processor fits it to its soft-token budget.")
@BENCH_JSON
def latency(input_len, output_len, batch_size, repeats, seed, images_per_prompt, image_size, json_path, **kw):
    """TTFT of one prompt, TPOT at batch 1 and at --batch-size (random token prompts, greedy, no EOS); with
    --images-per-prompt, TTFT of prompts with images against text-only ones and the vision tower's rate."""
    from atomlite.benchmarks.offline import run_latency
    from atomlite.benchmarks.roofline import probe
    if min(input_len, output_len, batch_size, repeats) < 1 or output_len < 2:
        fail("--input-len, --batch-size and --repeats must be at least 1, --output-len at least 2")
    images = _image_load(images_per_prompt, image_size)
    engine = _bench_engine(kw)
    if images is not None and getattr(engine.model, "vision_spec", None) is None:
        fail(f"--images-per-prompt needs a model with a vision tower; {engine.config.model} has none (its "
             f"config.json has no vision_config)")
    probes = probe(engine.device, engine.config.torch_dtype)
    settings = dict(input_len=input_len, output_len=output_len, batch_size=batch_size, repeats=repeats)
    if images is None:
        rows = run_latency(engine, probes, input_len, output_len, batch_size, repeats, seed)
    else:
        from atomlite.benchmarks.images import run_image_latency
        rows = run_image_latency(engine, probes, images, input_len, output_len, batch_size, repeats, seed)
        settings |= dict(images_per_prompt=images.per_prompt, image_size=image_size)
    _bench_report(engine, "latency", rows, probes, settings, json_path)


def _image_load(images_per_prompt: int, image_size: str):
    from atomlite.benchmarks.images import ImageLoad, parse_image_size
    if images_per_prompt < 0:
        fail("--images-per-prompt must be 0 (text only) or more")
    try:
        width, height = parse_image_size(image_size)
    except ValueError as e:
        fail(str(e))
    return ImageLoad(images_per_prompt, width, height) if images_per_prompt else None


@bench.command()
@engine_options
@click.option("--num-prompts", type=int, default=64, show_default=True, help="Prompts, all submitted at once.")
@click.option("--input-len", type=int, default=512, show_default=True, help="Random prompt tokens.")
@click.option("--output-len", type=int, default=128, show_default=True, help="Tokens generated per prompt.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts.")
@BENCH_JSON
def throughput(num_prompts, input_len, output_len, seed, json_path, **kw):
    """Offline throughput: all --num-prompts submitted at once, output tokens per second."""
    from atomlite.benchmarks.offline import run_throughput
    from atomlite.benchmarks.roofline import probe
    if min(num_prompts, input_len) < 1 or output_len < 2:
        fail("--num-prompts and --input-len must be at least 1, --output-len at least 2")
    engine = _bench_engine(kw)
    probes = probe(engine.device, engine.config.torch_dtype)
    rows = run_throughput(engine, probes, num_prompts, input_len, output_len, seed)
    settings = dict(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    _bench_report(engine, "throughput", rows, probes, settings, json_path)


@bench.command()
@engine_options
@click.option("--input-len", type=int, default=512, show_default=True, help="Prompt tokens.")
@click.option("--output-len", type=int, default=128, show_default=True, help="Tokens generated per prompt.")
@click.option("--repeats", "--num-iters", "repeats", type=int, default=3, show_default=True,
              help="Prompts decoded one after another by each drafter.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts.")
@BENCH_JSON
def speculative(input_len, output_len, repeats, seed, json_path, **kw):
    """Speculative decoding at batch 1 against no drafts, in one run: oracle drafts (all accepted), rejected drafts
    (none), the verify step against a decode step, and --speculative-config's own drafter (required)."""
    from atomlite.benchmarks.report import device_name, write_json
    from atomlite.benchmarks.speculative import format_speculative, run_speculative
    if min(input_len, repeats) < 1 or output_len < 2:
        fail("--input-len and --repeats must be at least 1, --output-len at least 2")
    if not kw.get("speculative_config"):
        fail('bench speculative needs --speculative-config, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'')
    engine = _bench_engine(kw)
    rows = run_speculative(engine, input_len, output_len, repeats, seed)
    spec = engine.config.model_spec
    click.echo("\n".join([f"device: {device_name(engine.device)}; model: {spec.path} (load format "
                          f"{engine.config.load_format}); {input_len}-token prompts, {output_len} tokens each",
                          engine.graph_note, *format_speculative(rows)]))
    write_json(json_path, {"benchmark": "speculative", "device": device_name(engine.device), "model": str(spec.path),
                           "graphs": engine.graph_note, "results": rows,
                           "settings": dict(input_len=input_len, output_len=output_len, repeats=repeats)})


@bench.command(name="serve")
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True,
              help="Server root (atomlite serve or any OpenAI-compatible server).")
@click.option("--model", "model", default=None, type=click.Path(),
              help="The served checkpoint's folder (config.json: vocabulary for the random prompts, bytes for the "
                   "roofline); default: the bundled demo model.")
@click.option("--served-model-name", default=None, help="Model name to send (default: the server's first model).")
@click.option("--num-prompts", type=int, default=64, show_default=True, help="Requests sent.")
@click.option("--input-len", "--random-input-len", "input_len", type=int, default=512, show_default=True,
              help="Random prompt tokens per request (--random-input-len: vLLM's name).")
@click.option("--output-len", "--random-output-len", "output_len", type=int, default=128, show_default=True,
              help="Tokens generated per request, EOS ignored (--random-output-len: vLLM's name).")
@click.option("--request-rate", type=float, default=float("inf"), show_default=True,
              help="Requests per second (Poisson arrivals); inf sends them all at once.")
@click.option("--max-concurrency", type=int, default=None, help="Most requests in flight at once.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts.")
@click.option("--images-per-prompt", type=int, default=0, show_default=True,
              help="Send chats, each with this many PNG data-URL images of random pixels and --input-len random "
                   "letters (the server needs a tokenizer and chat template), instead of token-id completions.")
@click.option("--image-size", default="896x896", show_default=True, help="Pixels of each image, WIDTHxHEIGHT.")
@click.option("--save-result", is_flag=True, help="Write the results to --result-filename, or to a file named "
                                                   "after the date and the model (vLLM's flag).")
@BENCH_JSON
def bench_serve(base_url, model, served_model_name, num_prompts, input_len, output_len, request_rate,
                max_concurrency, seed, images_per_prompt, image_size, save_result, json_path):
    """Stream random token prompts (or chats with images) from a running server: TTFT, TPOT, ITL (mean, p50, p90,
    p99), tok/s, and GET /health's latency meanwhile."""
    import httpx
    from tqdm import tqdm

    from atomlite.benchmarks.report import write_json
    from atomlite.benchmarks.serving import chat_workload, completion_workload, format_summary, run_serving
    from atomlite.config import EngineConfig
    if min(num_prompts, input_len, output_len) < 1 or request_rate <= 0 or (max_concurrency or 1) < 1:
        fail("--num-prompts, --input-len, --output-len, --max-concurrency and --request-rate must be positive")
    images = _image_load(images_per_prompt, image_size)
    try:
        config = EngineConfig(model=model or str(default_model()), load_format="dummy")
        name = served_model_name or httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=10).json()["data"][0]["id"]
    except ConfigError as e:
        fail(str(e))
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        fail(f"no OpenAI-compatible server answered at {base_url}/v1/models ({e}): start one or fix --base-url")
    if images is None:
        import torch
        g = torch.Generator().manual_seed(seed)
        prompts = torch.randint(3, config.model_spec.hf["vocab_size"], (num_prompts, input_len), generator=g)
        workload = completion_workload(name, prompts.tolist(), output_len)
    else:
        from atomlite.benchmarks.images import image_chats
        workload = chat_workload(name, image_chats(num_prompts, images, input_len, seed), output_len)
    with tqdm(total=num_prompts, desc="requests", leave=False) as bar:
        summary = run_serving(base_url, workload, request_rate, max_concurrency, seed, bar.update)
    concurrency = max(1, round(summary["mean_concurrency"]))  # what ran, not what was allowed
    summary["roofline_tpot_ms"] = _serve_roofline_ms(config, concurrency, input_len + output_len // 2)
    click.echo("\n".join(format_summary(summary)))
    click.echo(f"roofline TPOT at concurrency {concurrency} (the mean in flight): {summary['roofline_tpot_ms']:.2f} ms (weights + KV "
               f"per decode step of --model over this machine's probed copy bandwidth); mean TPOT is "
               f"{summary['mean_tpot_ms'] / summary['roofline_tpot_ms']:.2f}x that")
    if save_result and json_path is None:
        json_path = Path(f"atomlite-bench-serve-{time.strftime('%Y%m%d-%H%M%S')}-{name.replace('/', '_')}.json")
    write_json(json_path, {"benchmark": "serve", "base_url": base_url, "model": name,
                           "settings": dict(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                                            request_rate=request_rate, max_concurrency=max_concurrency,
                                            images_per_prompt=images_per_prompt, image_size=image_size),
                           "results": summary})


def _serve_roofline_ms(config, batch: int, context: int) -> float:
    import torch

    from atomlite.benchmarks.roofline import decode_step_bytes, probe
    from atomlite.model_ops.platform import Platform
    from atomlite.plan import meta_model
    model = meta_model(config, Platform())
    step = decode_step_bytes(model, model.kv_specs(config.kv_dtype(Platform())), batch, context)["total"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return step / probe(device, config.torch_dtype).copy_bytes_per_s * 1e3
