"""The server's adapters by name (the API process's side): --lora-modules at startup, /v1/load_lora_adapter and
/v1/unload_lora_adapter at runtime. Each is checked here against the model's shapes before any request can use it:
the model is built on the meta device (no memory, no GPU) for its projections' shapes, so a bad adapter is a 400 (a
missing one a 404) and never reaches the engine core, which reads and checks it again when it loads it."""
import itertools
import json

import torch

from atomlite.loader import _alias
from atomlite.lora.peft import AdapterNotFound, read_adapter
from atomlite.lora.request import LoRARequest
from atomlite.lora.targets import attach_slots
from atomlite.model_ops import dispatch
from atomlite.model_ops.lora import RowSlots
from atomlite.model_ops.platform import Platform

RUNTIME_UPDATING = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's switch for the load/unload endpoints


def parse_lora_modules(values: list[str]) -> list[tuple[str, str]]:
    """--lora-modules as vLLM takes it: name=path, or JSON {"name": ..., "path": ...}; ValueError naming the bad one."""
    modules = []
    for value in values:
        if value.lstrip().startswith("{"):
            try:
                spec = json.loads(value)
                modules.append((spec["name"], spec["path"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"--lora-modules {value!r}: JSON must be {{\"name\": ..., \"path\": ...}}") from None
        else:
            name, eq, path = value.partition("=")
            if not eq or not name or not path:
                raise ValueError(f"--lora-modules {value!r}: give name=path (or JSON {{\"name\": ..., \"path\": ...}})")
            modules.append((name, path))
    return modules


class ServedAdapters:
    """model: the model as built on the meta device (for its projections' shapes)."""

    def __init__(self, model, max_lora_rank: int, base_names: list[str]):
        with dispatch.use(Platform()), torch.device("meta"):
            self.targets = attach_slots(model, 1, max_lora_rank, RowSlots(1, "meta"))
        self.alias = lambda name: _alias(model, name)
        self.max_rank, self.base_names = max_lora_rank, list(base_names)
        self.by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def add(self, name: str, path: str) -> LoRARequest:
        """ValueError (AdapterNotFound for a missing folder or file) naming what is wrong."""
        if name in self.by_name:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")
        if name in self.base_names:
            raise ValueError(f"The lora adapter name '{name}' is the base model's served name; give it another")
        request = LoRARequest(name, next(self._ids), path)
        read_adapter(request, self.targets, self.max_rank, self.alias)
        self.by_name[name] = request
        return request

    def remove(self, name: str) -> LoRARequest:
        if name not in self.by_name:
            raise AdapterNotFound(f"The lora adapter '{name}' cannot be found.")
        return self.by_name.pop(name)
