"""The multimodal settings users give, in vLLM's names, checked: --limit-mm-per-prompt, --mm-processor-kwargs (and
the request field mm_processor_kwargs), --allowed-local-media-path, --allowed-media-domains. Import-light: the
engine config reads it."""
import json
from pathlib import Path

from atomlite.multimodal.patches import SUPPORTED_SOFT_TOKENS

MODALITIES = ("image", "video", "audio")
DEFAULT_LIMIT = 999  # vLLM's default per modality
PROCESSOR_KWARGS = ("max_soft_tokens",)


def json_object(value, name: str, example: str = '{"image": 2}') -> dict:
    """A flag's JSON object (or the dict itself); ValueError naming the flag otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}: not JSON ({e}); give an object such as '{example}'") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a JSON object, got {type(value).__name__}")
    return value


def parse_mm_limits(value: dict | str | None, name: str = "--limit-mm-per-prompt") -> dict[str, int]:
    """{"image": 2, "video": 1} (a dict or its JSON) -> the limit of each modality, DEFAULT_LIMIT where not given."""
    given = {} if value is None else json_object(value, name)
    limits = dict.fromkeys(MODALITIES, DEFAULT_LIMIT)
    for modality, count in given.items():
        if modality not in MODALITIES:
            raise ValueError(f"{name}: {modality!r} is not a modality atomlite takes; use {', '.join(MODALITIES)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{name}: {modality} must be an integer >= 0, got {count!r}")
        limits[modality] = count
    return limits


def parse_mm_processor_kwargs(value: dict | str | None, name: str = "mm_processor_kwargs") -> dict:
    """Gemma 4's processor kwargs, checked: max_soft_tokens in 70, 140, 280, 560, 1120."""
    kwargs = {} if value is None else json_object(value, name)
    for key, item in kwargs.items():
        if key not in PROCESSOR_KWARGS:
            raise ValueError(f"{name}.{key} is not a processor setting of this model; it takes "
                             f"{', '.join(PROCESSOR_KWARGS)}")
        if isinstance(item, bool) or item not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(f"{name}.max_soft_tokens: {item!r} is not one of "
                             f"{', '.join(map(str, SUPPORTED_SOFT_TOKENS))}")
    return dict(kwargs)


def parse_allowed_local_media_path(value: str | Path | None) -> Path | None:
    if value is None or value == "":
        return None
    path = Path(value)
    if not path.is_absolute() or not path.is_dir():
        raise ValueError(f"--allowed-local-media-path {value}: must be an existing directory given as an absolute "
                         f"path")
    return path.resolve()


def parse_allowed_media_domains(value: list[str] | tuple[str, ...] | str | None) -> tuple[str, ...]:
    """Host names (exact match, case-insensitive); each string is split on commas and spaces."""
    if value is None:
        return ()
    names = [name for item in ([value] if isinstance(value, str) else value)
             for name in (item.replace(",", " ").split() if isinstance(item, str) else [item])]
    for host in names:
        if not isinstance(host, str) or not host or "/" in host or (":" in host and not host.startswith("[")):
            raise ValueError(f"--allowed-media-domains {host!r}: give host names alone (no scheme, port or path)")
    return tuple(h.lower() for h in names)
