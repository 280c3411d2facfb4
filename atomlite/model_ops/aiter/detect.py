"""Is AITER usable here, and which of its functions exist: decided without importing it unless this machine is a
supported ROCm GPU with AITER installed. A hand-made Platform (`atomlite plan --platform gfx950+aiter`) is answered
from the pinned signatures (the newest pinned AITER), so nothing is imported on CPU or CUDA machines.
"""
import importlib
import importlib.metadata
import inspect
import json
import logging
from functools import cache
from importlib.util import find_spec
from pathlib import Path

import torch

from atomlite.model_ops.platform import Platform

logger = logging.getLogger("atomlite.aiter")

SUPPORTED_ARCHS = ("gfx942", "gfx950")
FP4_ARCHS = ("gfx950",)
SIGNATURES_FILE = Path(__file__).with_name("signatures.json")
ASSUMED_VERSION = "e4048607a5"

_state = {"module": None, "error": None, "tried": False}


@cache
def pinned() -> dict:
    return json.loads(SIGNATURES_FILE.read_text())["versions"]


@cache
def local_platform() -> Platform | None:
    """This machine as an AITER platform, or None; checks find_spec, ROCm torch, a visible GPU, its arch."""
    if find_spec("aiter") is None or not torch.version.hip or not torch.cuda.is_available():
        return None
    arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    return Platform("rocm", arch, has_aiter=True) if arch in SUPPORTED_ARCHS else None


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("amd-aiter")
    except importlib.metadata.PackageNotFoundError:
        return None


def load():
    """The real aiter module, imported once; None (and the reason in load_error()) when that fails."""
    if not _state["tried"]:
        _state["tried"] = True
        if local_platform() is None:
            _state["error"] = "no supported ROCm GPU with AITER on this machine"
        else:
            logger.info("importing aiter %s: a cold JIT cache builds its kernels with hipcc first, which can take "
                        "minutes (builds are kept in $AITER_JIT_DIR or aiter/jit)", installed_version() or "")
            try:
                _state["module"] = importlib.import_module("aiter")
            # AITER raises RuntimeError (no ROCm version file) as well as ImportError on a broken install.
            except Exception as e:  # noqa: BLE001
                _state["error"] = f"import aiter failed: {type(e).__name__}: {e}"
                logger.warning("AITER unavailable, ops fall back to Triton/torch (%s)", _state["error"])
    return _state["module"]


def load_error() -> str | None:
    load()
    return _state["error"]


def resolve(path: str):
    """`name` -> aiter.name; `a.b.name` -> aiter.a.b.name (the submodule imported on demand); `a.b.Class.name` ->
    that attribute of a class of aiter.a.b. None if absent."""
    root = load()
    if root is None:
        raise RuntimeError(f"AITER function {path} called without AITER ({load_error()})")
    module_path, _, name = path.rpartition(".")
    try:
        return getattr(_module(root, module_path), name, None)
    except ImportError:
        owner_path, _, owner = module_path.rpartition(".")
        try:
            return getattr(getattr(_module(root, owner_path), owner, None), name, None)
        except Exception:  # noqa: BLE001
            return None
    except Exception:  # noqa: BLE001  a submodule that fails to import counts as absent
        return None


def _module(root, dotted: str):
    return importlib.import_module(f"{root.__name__}.{dotted}") if dotted else root


def parameter_names(path: str) -> frozenset[str]:
    """Keyword names the loaded function accepts; when it cannot be inspected, the pinned signature of the installed
    version (or of the newest pinned one)."""
    return _parameter_names(resolve(path), path)


@cache
def _parameter_names(fn, path: str) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        version = installed_version()
        functions = pinned()[version if version in pinned() else ASSUMED_VERSION]["functions"]
        return frozenset(p["name"] for p in functions[path]["params"])


def missing_functions(paths, platform: Platform) -> list[str]:
    """Which of `paths` the platform's AITER lacks: the real module on this machine, the pinned one otherwise."""
    if platform == local_platform():
        if load() is None:
            return list(paths)
        return [p for p in paths if resolve(p) is None]
    known = pinned()[ASSUMED_VERSION]["functions"]
    return [p for p in paths if p not in known]


def call(path: str, **kwargs):
    """Every AITER call goes through here, by keyword only: signatures drift between AITER versions."""
    return resolve(path)(**kwargs)
