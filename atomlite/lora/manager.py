"""Rank 0's view of the adapters: which adapter holds which device slot, and the slots a batch needs loaded.

The scheduler admits a sequence only while the running ones use at most --max-loras adapters, so the adapters of a
batch always find slots: a slot whose adapter no running sequence uses is free to take (least recently used
first). Loads go to every rank with the step (RunnerStep.lora_loads). Sequences are the engine's (engine.sequence),
named here only in hints: the engine imports this package, not the other way round."""
from atomlite.lora.request import LoRARequest
from atomlite.lora.slots import AdapterSlots


def identity(request: LoRARequest) -> tuple[int, str]:
    return request.lora_int_id, request.lora_path


class LoRAManager:
    def __init__(self, slots: AdapterSlots):
        self.slots = slots
        self.owners: list[LoRARequest | None] = [None] * slots.config.max_loras
        self.last_used = [0] * len(self.owners)
        self._clock = 0

    def prepare(self, seq: "Sequence", request: LoRARequest) -> None:
        """Checks the adapter (ValueError naming what is wrong) and gives seq its prefix-cache identity."""
        seq.lora, seq.lora_key = request, self.slots.read(request).key

    def assign(self, batch: list[tuple["Sequence", int]], running: list["Sequence"]) -> list[tuple[int, LoRARequest]]:
        """Sets each sequence's lora_slot; returns the (slot, adapter) loads the step must make first."""
        loads = []
        in_use = {identity(seq.lora) for seq in running if seq.lora is not None}
        for seq, _ in batch:
            if seq.lora is None:
                seq.lora_slot = -1
                continue
            slot = self._resident(seq.lora)
            if slot is None:
                slot = self._free_slot(in_use)
                self.owners[slot] = seq.lora
                loads.append((slot, seq.lora))
            self._clock += 1
            self.last_used[slot] = self._clock
            seq.lora_slot = slot
        return loads

    def _resident(self, request: LoRARequest) -> int | None:
        return next((i for i, owner in enumerate(self.owners)
                     if owner is not None and identity(owner) == identity(request)), None)

    def _free_slot(self, in_use: set) -> int:
        candidates = [i for i, owner in enumerate(self.owners) if owner is None or identity(owner) not in in_use]
        if not candidates:
            raise RuntimeError("every LoRA slot holds an adapter of a running sequence (the scheduler admits at most "
                               "--max-loras adapters)")
        return min(candidates, key=lambda i: (self.owners[i] is not None, self.last_used[i]))

    def usage(self, scheduler) -> tuple[int, list[str], list[str]]:
        """(slots, adapters of the running sequences, of the waiting ones): vLLM's lora_requests_info."""
        def names(seqs) -> list[str]:
            return sorted({seq.lora.lora_name for seq in seqs if seq.lora is not None})
        return len(self.owners), names(scheduler.running), names(scheduler.waiting)
