"""One rank's adapter slots: LoRASlots on the model's target projections, the step's row slots, and the adapters
read from disk (a host cache of --max-cpu-loras, least recently used out). Every rank loads a slot itself, from the
adapter's folder, when a step says so (RunnerStep.lora_loads); rank 0 also checks adapters when they are added."""
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from atomlite.loader import _alias
from atomlite.lora.config import LoRAConfig
from atomlite.lora.peft import LoRAAdapter, read_adapter
from atomlite.lora.request import LoRARequest
from atomlite.lora.targets import attach_slots, write_slot
from atomlite.model_ops.lora import RowSlots


class AdapterSlots:
    def __init__(self, model: nn.Module, config: LoRAConfig, max_rows: int, device: torch.device):
        self.model, self.config = model, config
        self.rows = RowSlots(max_rows, device)
        self.targets = attach_slots(model, config.max_loras, config.max_lora_rank, self.rows)
        self._host: OrderedDict[tuple[int, str], LoRAAdapter] = OrderedDict()
        pinned = device.type == "cuda"
        self._mirror = torch.full((max_rows,), -1, dtype=torch.int32, device="cpu", pin_memory=pinned)
        self._copied = torch.cuda.Event() if pinned else None
        self._all_base = True  # the device's row slots are all -1

    def read(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter, checked against the model (ValueError naming what is wrong), from the host cache or disk."""
        key = (request.lora_int_id, request.lora_path)
        adapter = self._host.get(key)
        if adapter is None:
            adapter = read_adapter(request, self.targets, self.config.max_lora_rank,
                                   lambda name: _alias(self.model, name))
            self._host[key] = adapter
            while len(self._host) > self.config.cpu_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(key)
        return adapter

    def load(self, slot: int, request: LoRARequest) -> None:
        write_slot(self.model, self.targets, slot, self.read(request).weights)

    def fill_rows(self, row_slots: np.ndarray | None) -> None:
        """The step's row slots into the device buffer (the rest -1); None: every row runs the base model."""
        if row_slots is None and self._all_base:
            return
        if self._copied is not None:
            self._copied.synchronize()  # the step before may still be copying from the mirror
        mirror = self._mirror.numpy()
        mirror[:] = -1
        if row_slots is not None:
            mirror[:len(row_slots)] = row_slots
        self.rows.slots.copy_(self._mirror, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self._all_base = row_slots is None
