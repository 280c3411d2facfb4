"""`atomlite serve` under vLLM's spelling: the flags vLLM users type by habit. Those atomlite honours are ordinary
options (cli.py, SERVE_OPTIONS below); those whose meaning here is nothing are taken and named at startup
(NO_EFFECT); those atomlite cannot honour are refused with a line saying why (REFUSED), never taken silently.
`--served-model-name` and `--lora-modules` take several values after one flag, as vLLM's do."""
import json
import sys

import click

# flag -> why atomlite cannot do what it asks
REFUSED = {
    "--pipeline-parallel-size": "atomlite has no pipeline parallelism: use --tensor-parallel-size within a host, or "
                                "run atomlite inside vLLM for pipeline parallelism across hosts "
                                "(docs/SERVING.md, 'Across hosts')",
    "-pp": "atomlite has no pipeline parallelism (see --pipeline-parallel-size)",
    "--data-parallel-size": "atomlite runs one engine per server: start one server per GPU group behind a load "
                            "balancer",
    "-dp": "atomlite runs one engine per server: start one server per GPU group behind a load balancer",
    "--enable-expert-parallel": "atomlite shards MoE experts by tensor parallelism only",
    "--cpu-offload-gb": "atomlite keeps every weight on the device",
    "--kv-transfer-config": "atomlite has no disaggregated prefill",
    "--revision": "atomlite reads the snapshot in the hub cache: download that revision (huggingface-cli download "
                  "--revision) and pass its folder",
    "--tokenizer-revision": "atomlite reads the snapshot in the hub cache: download that revision and pass its folder "
                            "as --tokenizer",
    "--download-dir": "atomlite reads the Hugging Face cache: set HF_HUB_CACHE instead",
    "--ssl-keyfile": "atomlite serves plain HTTP: put a TLS-terminating proxy in front",
    "--ssl-certfile": "atomlite serves plain HTTP: put a TLS-terminating proxy in front",
    "--uds": "atomlite listens on TCP only (--host, --port)",
    "--middleware": "atomlite loads no code named on its command line",
    "--tool-parser-plugin": "atomlite loads no code named on its command line; its tool-call parsers: auto, gemma4",
    "--hf-overrides": "atomlite reads config.json as it is: edit a copy of the checkpoint's config.json",
    "--task": "atomlite generates text only",
    "--runner": "atomlite generates text only",
    "--speculative-model": "vLLM's old flag: use --speculative-config '{\"method\": \"mtp\", \"model\": DIR, "
                           "\"num_speculative_tokens\": 4}'",
}
# flag -> (values it may take: None for a plain flag, else the values whose meaning atomlite already has), why
NO_EFFECT = {
    "--trust-remote-code": (None, "atomlite runs none of a checkpoint's code (its models are its own)"),
    "--disable-log-requests": (None, "atomlite does not log requests"),
    "--disable-log-stats": (None, "atomlite logs no periodic stats (see /metrics)"),
    "--disable-uvicorn-access-log": (None, "atomlite's HTTP server keeps no access log"),
    "--tokenizer-mode": (("auto", "hf"), "atomlite loads the Hugging Face tokenizer, vLLM's auto"),
    "--distributed-executor-backend": (("mp",), "atomlite starts its tensor-parallel ranks as processes, vLLM's mp"),
    "--max-logprobs": (("20",), "atomlite's bound on logprobs is 20, vLLM's default"),
}


def refuse(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _split(arg: str) -> tuple[str, str | None]:
    flag, eq, value = arg.partition("=")
    return (flag, value) if eq and flag.startswith("--") else (arg, None)


def _several(args: list[str], i: int, value: str | None, missing: str) -> tuple[list[str], int]:
    """vLLM's nargs="+": the values of the flag at args[i] (its =value, else the arguments up to the next flag)
    and the index of the last one taken."""
    values = [value] if value is not None else []
    while value is None and i + 1 < len(args) and not args[i + 1].startswith("-"):
        i += 1
        values.append(args[i])
    if not values:
        refuse(missing)
    return values, i


def rewrite_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments click parses, a line for each flag taken with no effect). Refused flags exit here;
    `--served-model-name a b` becomes one `--served-model-name` per name (a later one replaces an earlier one, as
    in vLLM); `--lora-modules a=PATH b=PATH` one `--lora-modules` per adapter (every one kept)."""
    out, notes, names, rest, i = [], [], [], [], 0
    while i < len(args):
        flag, value = _split(args[i])
        if flag == "--":
            rest = args[i:]
            break
        if flag in REFUSED:
            refuse(f"{flag}: {REFUSED[flag]}")
        if flag in NO_EFFECT:
            values, why = NO_EFFECT[flag]
            if values is not None:
                if value is None:
                    i += 1
                    value = args[i] if i < len(args) else None
                if value not in values:
                    refuse(f"{flag} {value}: atomlite takes only {' or '.join(values)} ({why})")
            notes.append(f"{flag}{'' if values is None else ' ' + value}: no effect here; {why}")
        elif flag == "--served-model-name":
            names, i = _several(args, i, value, "--served-model-name needs a name")
        elif flag == "--lora-modules":
            values, i = _several(args, i, value, "--lora-modules needs name=path (one or several)")
            out += [x for v in values for x in ("--lora-modules", v)]
        else:
            out.append(args[i])
        i += 1
    return out + [x for name in names for x in ("--served-model-name", name)] + rest, notes


class ServeCommand(click.Command):
    """`serve` with vLLM's flag handling (rewrite_args) before click parses; the no-effect notes are kept in
    ctx.meta for the startup report."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args, notes = rewrite_args(list(args))
        ctx.meta["no_effect_flags"] = notes
        return super().parse_args(ctx, args)


def _json_list(ctx, param, value):
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise click.BadParameter(f"{value!r} is not a JSON list of strings, e.g. '[\"https://example.com\"]'")
    return parsed


SERVE_OPTIONS = [
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Seed of the engine's sampling for requests that give none (vLLM's)."),
    click.option("--tokenizer", default=None,
                 help="Folder (or cached hub id) of the tokenizer, when not the model's."),
    click.option("--quantization", "-q", default=None,
                 help="The checkpoint's quantization method (quark), checked against its quantization_config; "
                      "atomlite does not quantize at load time."),
    click.option("--generation-config", default="auto", show_default=True,
                 help="Sampling defaults: auto (the checkpoint's generation_config.json), vllm (none), or a folder "
                      "holding a generation_config.json. A request's own values win."),
    click.option("--override-generation-config", default=None,
                 help='JSON laid over the generation config, e.g. \'{"temperature": 0.5}\'.'),
    click.option("--trust-request-chat-template", is_flag=True,
                 help="Trust requests with the template's structure (vLLM's flag): a request's chat_template "
                      "replaces the chat template, special tokens typed in messages become control tokens, and "
                      "chat_template_kwargs may set bos_token and the like. Off: all three are refused or kept as "
                      "text."),
    click.option("--allowed-origins", default=None, callback=_json_list,
                 help='CORS: origins allowed to call the API from a browser, as JSON: \'["https://a.example"]\' or '
                      '\'["*"]\'. Off by default (vLLM allows every origin).'),
    click.option("--allowed-methods", default=None, callback=_json_list,
                 help='CORS methods as JSON (default with --allowed-origins: \'["*"]\').'),
    click.option("--allowed-headers", default=None, callback=_json_list,
                 help='CORS headers as JSON (default with --allowed-origins: \'["*"]\').'),
    click.option("--allow-credentials", is_flag=True, help="CORS: allow credentials (cookies, Authorization)."),
    click.option("--enable-lora", is_flag=True, help="Serve LoRA adapters (PEFT's) beside the base model: a request's "
                                                     "model names the adapter (docs/LORA.md)."),
    click.option("--lora-modules", multiple=True,
                 help="Adapters served from the start: name=PATH, one or several after the flag (or vLLM's JSON "
                      "'{\"name\": ..., \"path\": ...}'); needs --enable-lora."),
    click.option("--max-loras", type=int, default=1, show_default=True,
                 help="Adapters one batch may hold (slots on the device)."),
    click.option("--max-lora-rank", type=int, default=16, show_default=True, help="The largest adapter rank served."),
    click.option("--max-cpu-loras", type=int, default=None,
                 help="Adapters kept read in host memory (default: --max-loras)."),
]


def serve_options(fn):
    for option in reversed(SERVE_OPTIONS):
        fn = option(fn)
    return fn


def cors_settings(origins, methods, headers, credentials: bool) -> dict | None:
    """CORSMiddleware's settings, or None where --allowed-origins was not given (CORS off)."""
    if origins is None:
        if methods is not None or headers is not None or credentials:
            refuse("--allowed-methods, --allowed-headers and --allow-credentials need --allowed-origins")
        return None
    return {"allow_origins": origins, "allow_methods": methods or ["*"], "allow_headers": headers or ["*"],
            "allow_credentials": credentials}


PARSER_EFFECTS = {"tool_call_parser": "tool calls stay in content, and tool_choice auto, required or a named tool "
                                      "is a 400",
                  "reasoning_parser": "thinking stays in content"}


def parser_notes(chat) -> list[str]:
    """What --tool-call-parser and --reasoning-parser auto resolved to, and why (chat: the server's ChatTemplate,
    None without a tokenizer)."""
    from atomlite.server.chat import PARSER_MARKERS
    lines = []
    for flag, marker in PARSER_MARKERS.items():
        choice = getattr(chat.options, flag) if chat is not None else "auto"
        if choice != "auto":
            continue
        name = f"--{flag.replace('_', '-')} auto"
        resolved = getattr(chat, flag) if chat is not None else None
        if resolved is not None:
            lines.append(f"{name}: {resolved} (the chat template writes {marker})")
        elif chat is None or not chat.template:
            lines.append(f"{name}: off (this model has no chat template); {PARSER_EFFECTS[flag]}")
        else:
            lines.append(f"{name}: off (the chat template never writes {marker}); {PARSER_EFFECTS[flag]}")
    return lines


def startup_notes(config, chat, ctx: click.Context) -> list[str]:
    """serve's startup lines about vLLM's flags: where sampling defaults come from, the auto parsers, and each flag
    taken with no effect."""
    return [config.generation_defaults.describe(), *parser_notes(chat), *ctx.meta.get("no_effect_flags", [])]
