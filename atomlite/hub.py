"""`--model` as a Hugging Face hub repo id (`google/gemma-4-31B-it`): resolved to a snapshot folder in the hub's
cache, fetching only what atomlite reads. A local folder always wins over a repo id.

Two steps, so that `atomlite plan` never downloads weights: the config and tokenizer files when the spec is read
(`config_snapshot`), the safetensors shards when the weights are loaded (`fetch_weights`; with an index, only the
shards that hold tensors the model reads). A snapshot already cached is used without asking the hub;
HF_HUB_OFFLINE=1 never asks it.
"""
import json
import re
from collections.abc import Callable
from pathlib import Path

from atomlite.errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                "chat_template.json", INDEX_FILE]
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_repo_id(model: str) -> bool:
    """`org/name` that is not a folder here (a path like ./x, /x or ~/x never is a repo id)."""
    return bool(REPO_ID.fullmatch(model)) and ".." not in model and not Path(model).exists()


def config_snapshot(repo_id: str) -> Path:
    """The snapshot folder of repo_id holding at least its config.json and tokenizer files."""
    return _snapshot(repo_id, CONFIG_FILES, "config.json", lambda folder: (folder / "config.json").exists())


def fetch_weights(repo_id: str, folder: Path, wanted: Callable[[str], bool]) -> None:
    """Make sure folder (repo_id's snapshot) holds every safetensors file with a tensor name that wanted() accepts."""
    commit = folder.name  # the snapshot config_snapshot chose, even if the repo's main has moved on since
    files = _shards_needed(folder / INDEX_FILE, wanted)
    if files is None:
        _snapshot(repo_id, ["*.safetensors"], "*.safetensors weights",
                  lambda snapshot: any(snapshot.glob("*.safetensors")), commit)
    else:
        _snapshot(repo_id, files, f"weight shards {', '.join(files)}",
                  lambda snapshot: all((snapshot / f).exists() for f in files), commit)


def _shards_needed(index: Path, wanted: Callable[[str], bool]) -> list[str] | None:
    """The shards an index lists for wanted tensors (tower-only shards left out); None without an index."""
    if not index.exists():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{index} is not a safetensors index with a weight_map ({e}): delete it from the "
                          f"hub cache to download it again") from None
    return sorted({file for name, file in weight_map.items() if wanted(name)})


def _snapshot(repo_id: str, patterns: list[str], what: str, complete: Callable[[Path], bool],
              revision: str | None = None) -> Path:
    """repo_id's snapshot folder once complete(folder) holds: from the cache when it does there, else downloaded
    (only files matching patterns)."""
    from huggingface_hub import constants, snapshot_download
    cached = _cached_snapshot(repo_id, patterns, revision)
    if cached is not None and complete(cached):
        return cached
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"--model {repo_id}: no such folder, and the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                          f"lacks the repo's {what}, which HF_HUB_OFFLINE=1 forbids downloading: unset HF_HUB_OFFLINE, "
                          f"or pass a checkpoint folder")
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - the hub client raises many classes (HTTP, network, validation)
        raise ConfigError(f"--model {repo_id}: no such folder, and the hub repo could not be downloaded "
                          f"({_first_line(e)}): check the name and the network, or pass a checkpoint folder") from None
    if not complete(folder):
        raise ConfigError(f"--model {repo_id}: the hub repo has no {what}: it is not a checkpoint atomlite can load")
    return folder


def _cached_snapshot(repo_id: str, patterns: list[str], revision: str | None) -> Path | None:
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or only partly): the caller downloads or reports it
        return None


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
