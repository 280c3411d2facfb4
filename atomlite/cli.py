"""The `atomlite` command: serve, generate, bench, eval, plan."""
import errno
import logging
import signal
import socket
import sys
import time
from pathlib import Path

import click

from atomlite.errors import ConfigError
from atomlite.vllm_flags import ServeCommand, cors_settings, serve_options, startup_notes

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
    click.option("--block-size", type=int, default=16, show_default=True, help="Tokens per KV block."),
    click.option("--kernel-backend", default="auto", type=click.Choice(["auto", "triton", "torch"]),
                 show_default=True, help="Kernel choice: auto = aiter > triton > torch by platform and shape."),
    click.option("--enable-prefix-caching/--no-enable-prefix-caching", " /--no-prefix-caching", "enable_prefix_caching",
                 default=True, help="Reuse cached prompt prefixes (on by default; --no-prefix-caching is "
                                    "--no-enable-prefix-caching)."),
    click.option("--load-format", default="auto", type=click.Choice(["auto", "dummy"]), show_default=True,
                 help="auto: the checkpoint's safetensors; dummy: seeded random weights from config.json alone."),
    click.option("--enforce-eager", is_flag=True, help="Never replay decode steps from CUDA/HIP graphs."),
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
RUNTIME_ONLY = ("load_format", "enforce_eager", "gpu_memory_utilization", "max_graph_batch", "no_overlap_decode",
                "enable_prefix_caching", "speculative_config", "disable_custom_all_reduce", "scheduling_policy",
                "max_num_encoder_input_tokens", "encoder_cache_memory")


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
            "seed", "tokenizer", "quantization", "generation_config", "override_generation_config")
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


@click.group(cls=VerboseGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log kernel choices and engine details.")
def main(verbose: bool):
    """atomlite: a small, fast, ROCm-first LLM inference runtime."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


@main.command()
@engine_options
@click.argument("prompts", nargs=-1, required=True)
@click.option("--max-tokens", type=int, default=32, show_default=True, help="Tokens to generate per prompt.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1 = off).")
@click.option("--top-k", type=int, default=-1, show_default=True, help="Sample among the k most likely (-1 = off).")
@click.option("--seed", type=int, default=None, help="Seed of the sampling (the engine's by default).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
def generate(prompts, max_tokens, temperature, top_p, top_k, seed, stop, **kw):
    """Generate a completion for each PROMPT."""
    from atomlite import LLM, SamplingParams
    from atomlite.config import EngineConfig
    from atomlite.tokenizer import require_tokenizer
    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                                seed=seed, stop=list(stop))
        require_tokenizer(EngineConfig(model=model_dir(kw), **engine_args(kw)).tokenizer_path)  # before the weights
        llm = LLM(model_dir(kw), **engine_args(kw))
        outputs = llm.generate(list(prompts), params)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        click.echo(f"--- {prompt!r} ({len(completion.token_ids)} tokens, {completion.finish_reason})")
        click.echo(prompt + completion.text)


@main.command(cls=ServeCommand)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 to listen on all).")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.option("--served-model-name", multiple=True,
              help="Model names clients may send, one or several after the flag (default: the folder name; "
                   "atomlite-demo for the demo model); responses carry the first.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on API routes.")
@click.option("--max-waiting", type=int, default=1024, show_default=True,
              help="Requests allowed to wait; beyond this the server answers 503.")
@click.option("--shutdown-timeout", type=float, default=30.0, show_default=True,
              help="Seconds SIGTERM waits for in-flight requests before aborting them.")
@click.option("--max-request-size", default="4MiB", show_default=True,
              help="Largest request body (e.g. 16MiB); a larger one gets 413 before it is read.")
@click.option("--chat-template", default=None,
              help="A Jinja chat template (a file, or the template itself) instead of the tokenizer's.")
@click.option("--tool-call-parser", type=click.Choice(["auto", "gemma4", "none"]), default="auto", show_default=True,
              help="Reads tool calls out of the output; auto: gemma4 when the chat template writes Gemma 4 calls.")
@click.option("--reasoning-parser", type=click.Choice(["auto", "gemma4", "none"]), default="auto", show_default=True,
              help="Moves thinking into reasoning_content; auto: gemma4 when the chat template writes its channel.")
@click.option("--enable-auto-tool-choice", is_flag=True,
              help="vLLM's flag; here tool_choice auto is on whenever a tool-call parser is.")
@click.option("--limit-mm-per-prompt", default=None,
              help='Most images and videos one prompt may carry, as JSON: \'{"image": 2, "video": 1}\' (999 each '
                   'by default, as vLLM).')
@click.option("--mm-processor-kwargs", default=None,
              help='The image processor\'s settings as JSON, e.g. \'{"max_soft_tokens": 560}\' (Gemma 4: 70, 140, '
                   '280, 560 or 1120 soft tokens per image); a request\'s mm_processor_kwargs overrides them.')
@click.option("--allowed-local-media-path", default=None,
              help="Let requests read file:// images and videos under this folder (symlinks out of it refused); "
                   "by default file:// URLs are refused.")
@click.option("--allowed-media-domains", multiple=True,
              help="Hosts that http(s) image and video URLs may come from (exact host names; repeat the flag or "
                   "separate by commas); by default only data: URLs are read.")
@engine_options
@serve_options
@click.argument("model_tag", required=False, metavar="[MODEL]")
def serve(host, port, served_model_name, api_key, max_waiting, shutdown_timeout, max_request_size, chat_template,
          tool_call_parser, reasoning_parser, enable_auto_tool_choice, model_tag, **kw):
    """Serve MODEL (a checkpoint folder or hub repo id, as --model takes; vLLM's positional form) over an
    OpenAI-compatible HTTP API."""
    if model_tag is not None:
        if kw["model"] is not None and kw["model"] != model_tag:
            fail(f"two models given ({model_tag} and --model {kw['model']}): give one")
        kw["model"] = model_tag
    try:
        import uvicorn

        from atomlite.server.app import build_app, engine_client
        from atomlite.server.chat import ChatOptions, load_chat_template
        from atomlite.server.draining import FLUSH_S, DrainingServer
    except ImportError as e:
        fail(f"the server needs its extra: pip install 'atomlite[serve]' ({e.name} is missing)")
    from atomlite.config import EngineConfig, parse_memory_size
    from atomlite.heap import freeze_startup_heap
    if max_waiting < 1:
        fail("--max-waiting must be at least 1")
    model = model_dir(kw)
    cors = cors_settings(*(kw.pop(k) for k in ("allowed_origins", "allowed_methods", "allowed_headers",
                                                "allow_credentials")))
    chat_options = ChatOptions(chat_template, tool_call_parser, reasoning_parser, kw.pop("trust_request_chat_template"))
    try:
        load_chat_template(chat_template)
        body_limit = parse_memory_size(max_request_size)
        sock = bound_socket(host, port)  # before loading: a taken port must not cost a model load first
        engine = engine_client(EngineConfig(model=model, **engine_args(kw)), max_waiting)
        engine.start()  # the engine core process builds the model; its errors come back here
    except (ConfigError, ValueError) as e:
        fail(str(e))
    names = list(served_model_name) or [default_served_name(kw["model"], model)]
    name = names[0]
    app = build_app(engine, names, api_key, body_limit, chat_options, cors)
    chat = app.state.server.chat_template
    if enable_auto_tool_choice and (chat is None or chat.tool_call_parser is None):
        engine.shutdown()
        fail("--enable-auto-tool-choice needs a tool-call parser: add --tool-call-parser gemma4 (and a "
             "--chat-template that renders tools if the model's does not)")
    server = DrainingServer(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=FLUSH_S + 1),
                            engine, shutdown_timeout)
    engine.on_death = lambda: setattr(server, "should_exit", True)
    # On SIGTERM/SIGINT the server drains (draining.py), then uvicorn re-raises the signal to the handler it found:
    # make that handler a clean exit, since a drained shutdown is a success.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(1 if engine.dead else 0))
    click.echo("\n".join(engine.startup_report + startup_notes(engine.config, chat, click.get_current_context())))
    click.echo(f"engine core: process {engine.core_pid}")
    freeze_startup_heap()
    sock.listen(server.config.backlog)  # connections from here on wait for uvicorn to accept them
    click.echo(f"serving {name!r} on http://{host}:{port} (OpenAI API under /v1)")
    server.run(sockets=[sock])
    if engine.dead:
        click.echo(f"error: {engine.dead}", err=True)
        sys.exit(1)
    if not server.started:
        fail("the server failed to start (see the log above)")
    click.echo("server stopped")


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet), or a ConfigError saying why it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on connections of sockets that name it, and with it
    # on, each small write of a stream (an SSE event, a response body after its headers) waits for the client's
    # delayed ACK, about 40 ms
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is already in use (another server?): stop it or pick "
                              f"another --port") from None
        reason = e.strerror or e
        raise ConfigError(f"cannot listen on {host}:{port} ({reason}): pick another --host or --port") from None
    return sock


def default_served_name(model_option: str | None, model: str) -> str:
    """The demo's name (also when its folder is named), a hub repo id as given (as vLLM names it), else the
    checkpoint folder's name."""
    from atomlite.hub import is_repo_id
    if model_option is None or Path(model).resolve() == default_model().resolve():
        return "atomlite-demo"
    return model if is_repo_id(model) else Path(model).name


@main.group(cls=VerboseGroup)
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
              engine.graph_note,
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


def default_model() -> Path:
    from atomlite.demo import demo_model_dir
    try:
        return demo_model_dir()
    except ConfigError as e:
        fail(str(e))


@main.command(name="eval")
@click.argument("jobs", nargs=-1)
@click.option("--all", "run_all", is_flag=True, help="Run every job of the catalog (filtered by --level).")
@click.option("--level", type=click.Choice(["pr", "nightly"]), default=None, help="Only jobs of this level.")
@click.option("--catalog", type=click.Path(path_type=Path), default=None,
              help="Job catalog (default: ci/accuracy/catalog.yaml of this checkout).")
@click.option("--report-dir", type=click.Path(path_type=Path), default=Path("accuracy-report"), show_default=True,
              help="Where results.json, report.md, server logs and per-sample records go.")
@click.option("--model", "model", type=click.Path(path_type=Path), default=None,
              help="Run the jobs on this checkpoint instead of the catalog's (e.g. a candidate build).")
@click.option("--limit", type=int, default=None, help="Score only the first N samples of each task.")
@click.option("--write-tasks", type=click.Path(path_type=Path), default=None,
              help="Only write the catalog's task files, ready for `lm_eval --include_path DIR`, and exit.")
def eval_command(jobs, run_all, level, catalog, report_dir, model, limit, write_tasks):
    """Accuracy jobs: serve the model, run lm-eval on it, compare with the catalog's thresholds.

    Exits non-zero when a job scores below its threshold, its metric is missing, or it fails to run."""
    try:
        from atomlite.accuracy.catalog import REPO_CI, load_catalog, select
        from atomlite.accuracy.runner import render_tasks, run_jobs, write_report
        import lm_eval  # noqa: F401
    except ImportError as e:
        fail(f"accuracy jobs need the eval extra: pip install 'atomlite[eval,serve]' ({e.name} is missing)")
    catalog = catalog or REPO_CI / "catalog.yaml"
    if write_tasks is not None:
        names = render_tasks(catalog.parent, write_tasks)
        click.echo(f"wrote {', '.join(names)} to {write_tasks}; run e.g.\n  lm_eval --model local-completions "
                   f"--model_args base_url=http://127.0.0.1:8000/v1/completions,model=atomlite-demo,"
                   f"tokenizer_backend=remote --include_path {write_tasks} --tasks {names[0]} --limit 5")
        return
    try:
        selected = select(load_catalog(catalog), jobs, run_all, level)
    except ConfigError as e:
        fail(str(e))
    results, interrupted = run_jobs(selected, catalog.parent, report_dir, model, limit)
    write_report(results, report_dir)
    click.echo((report_dir / "report.md").read_text())
    sys.exit(130 if interrupted else 0 if all(r.status in ("pass", "recorded") for r in results) else 1)


@main.command()
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
                   "for --model (default: the Gemma 4 configs of examples/configs), no GPU needed, and print "
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
        config = EngineConfig(model=model_dir(kw), **args)
        platform = parse_platform(platform_text) if platform_text else detect_platform(config.torch_device)
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


if __name__ == "__main__":
    main()
