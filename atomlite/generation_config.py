"""A checkpoint's generation_config.json, read as vLLM's `--generation-config` reads it: its sampling values
(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens) become the defaults a request's own values
override, and its end-of-sequence ids join the model's. `auto` reads the checkpoint's file, `vllm` ignores its
sampling values (the end-of-sequence ids still count), a folder reads that folder's file instead.
`--override-generation-config` (JSON) is laid over whichever was read."""
import json
from dataclasses import dataclass, field
from pathlib import Path

from atomlite.errors import ConfigError

FILE = "generation_config.json"
# transformers' GenerationConfig defaults: vLLM reads the file's differences from them (to_diff_dict), so a value
# equal to its default sets nothing
HF_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0,
               "max_new_tokens": None}
AS_SAMPLING_PARAMS = {"max_new_tokens": "max_tokens"}


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request that leaves a field out gets, in SamplingParams' names, and where it came from."""
    source: str  # the file whose sampling values were taken, or ""
    sampling: dict = field(default_factory=dict)
    eos_token_ids: tuple[int, ...] = ()
    mode: str = "auto"
    path: str = ""  # the generation_config.json read, or "" where there is none

    def describe(self) -> str:
        """The startup line."""
        if self.sampling:
            values = ", ".join(f"{k}={v}" for k, v in self.sampling.items())
            origin = self.source or "--override-generation-config"
            return (f"sampling defaults from {origin}: {values} (a request's own values win; "
                    f"--generation-config vllm ignores the file's)")
        if self.mode == "vllm":
            return "sampling defaults: vLLM's (--generation-config vllm)"
        if not self.path:
            return "sampling defaults: vLLM's (the checkpoint has no generation_config.json)"
        return f"sampling defaults: vLLM's ({self.path} sets none)"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e}): fix it or serve with --generation-config vllm") \
            from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _eos_ids(value) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def parse_override(value: dict | str | None) -> dict:
    if value is None or isinstance(value, dict):
        return dict(value or {})
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--override-generation-config is not JSON ({e}): e.g. '{{\"temperature\": 0.5}}'") \
            from None
    if not isinstance(parsed, dict):
        raise ConfigError("--override-generation-config must be a JSON object, e.g. '{\"temperature\": 0.5}'")
    return parsed


def load_generation_defaults(model_dir: Path, mode: str = "auto",
                             override: dict | str | None = None) -> GenerationDefaults:
    """mode: auto (model_dir's file), vllm (no sampling defaults) or a folder holding a generation_config.json."""
    if mode in ("auto", "vllm"):
        path = Path(model_dir) / FILE
    else:
        folder = Path(mode)
        if not folder.is_dir():
            raise ConfigError(f"--generation-config {mode!r}: not auto, vllm or a folder")
        path = folder / FILE
        if not path.is_file():
            raise ConfigError(f"--generation-config {mode}: the folder has no {FILE}")
    data = _read(path) if path.is_file() else {}
    config = {} if mode == "vllm" else {k: v for k, v in data.items() if k in HF_DEFAULTS and v != HF_DEFAULTS[k]}
    config.update({k: v for k, v in parse_override(override).items() if k in HF_DEFAULTS and v is not None})
    sampling = {AS_SAMPLING_PARAMS.get(k, k): v for k, v in config.items()}
    source = str(path) if data and mode != "vllm" and set(config) - set(parse_override(override)) else ""
    return GenerationDefaults(source, sampling, _eos_ids(data.get("eos_token_id")), mode, str(path) if data else "")
