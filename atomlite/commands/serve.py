"""`atomlite serve`: the OpenAI-compatible server (the API process; the engine core runs in its own)."""
import signal
import sys
from pathlib import Path

import click

from atomlite.commands.options import default_model, engine_args, engine_options, fail, model_dir
from atomlite.errors import ConfigError
from atomlite.vllm_flags import ServeCommand, cors_settings, serve_options, startup_notes


@click.command(cls=ServeCommand)
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
        from atomlite.server.listening import bound_socket
        from atomlite.server.timeouts import TimedH11Protocol
    except ImportError as e:
        fail(f"the server needs its extra: pip install 'atomlite[serve]' ({e.name} is missing)")
    from atomlite.config import EngineConfig, parse_memory_size
    from atomlite.cpu_threads import use_one_thread
    from atomlite.heap import freeze_startup_heap
    if max_waiting < 1:
        fail("--max-waiting must be at least 1")
    model = model_dir(kw)
    cors = cors_settings(*(kw.pop(k) for k in ("allowed_origins", "allowed_methods", "allowed_headers",
                                                "allow_credentials")))
    chat_options = ChatOptions(chat_template, tool_call_parser, reasoning_parser, kw.pop("trust_request_chat_template"))
    names = list(served_model_name) or [default_served_name(kw["model"], model)]
    name, lora_modules = names[0], kw.pop("lora_modules")
    try:
        load_chat_template(chat_template)
        body_limit = parse_memory_size(max_request_size)
        sock = bound_socket(host, port)  # before loading: a taken port must not cost a model load first
        config = EngineConfig(model=model, **engine_args(kw))
        loras = served_adapters(config, names, lora_modules)  # before loading: a bad adapter costs no model load
        engine = engine_client(config, max_waiting)
        engine.start()  # the engine core process builds the model; its errors come back here
    except (ConfigError, ValueError) as e:
        fail(str(e))
    app = build_app(engine, names, api_key, body_limit, chat_options, cors, loras)
    chat = app.state.server.chat_template
    if enable_auto_tool_choice and (chat is None or chat.tool_call_parser is None):
        engine.shutdown()
        fail("--enable-auto-tool-choice needs a tool-call parser: add --tool-call-parser gemma4 (and a "
             "--chat-template that renders tools if the model's does not)")
    server = DrainingServer(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=FLUSH_S + 1,
                                           http=TimedH11Protocol),
                            engine, shutdown_timeout)
    engine.on_death = lambda: setattr(server, "should_exit", True)
    # On SIGTERM/SIGINT the server drains (draining.py), then uvicorn re-raises the signal to the handler it found:
    # make that handler a clean exit, since a drained shutdown is a success.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(1 if engine.dead else 0))
    click.echo("\n".join(engine.startup_report + startup_notes(engine.config, chat, click.get_current_context())))
    click.echo(f"engine core: process {engine.core_pid}; the API process: 1 CPU thread")
    use_one_thread()  # the engine's threads are the core's; here they would only compete with it
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


def served_adapters(config, names: list[str], lora_modules: tuple[str, ...]):
    """The adapters --lora-modules names, each checked against the model; None without --enable-lora."""
    if not config.enable_lora:
        if lora_modules:
            fail("--lora-modules needs --enable-lora")
        return None
    from atomlite.engine.runner.rank import construct_model
    from atomlite.lora.served import ServedAdapters, parse_lora_modules
    from atomlite.model_ops.platform import Platform
    loras = ServedAdapters(construct_model(config, "meta", Platform()), config.max_lora_rank, names)
    for lora_name, path in parse_lora_modules(list(lora_modules)):
        loras.add(lora_name, path)
    return loras


def default_served_name(model_option: str | None, model: str) -> str:
    """The demo's name (also when its folder is named), a hub repo id as given (as vLLM names it), else the
    checkpoint folder's name."""
    from atomlite.hub import is_repo_id
    if model_option is None or Path(model).resolve() == default_model().resolve():
        return "atomlite-demo"
    return model if is_repo_id(model) else Path(model).name
