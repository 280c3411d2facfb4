"""The engine's LoRA settings (vLLM's names): how many adapters a batch may hold, their largest rank, and how many
parsed adapters stay in host memory."""
from dataclasses import dataclass

from atomlite.errors import ConfigError


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 1  # adapter slots on the device: distinct adapters one batch may hold
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # parsed adapters kept in host memory; None: max_loras

    def __post_init__(self):
        if self.max_loras < 1:
            raise ConfigError(f"--max-loras {self.max_loras} must be at least 1")
        if self.max_lora_rank < 1:
            raise ConfigError(f"--max-lora-rank {self.max_lora_rank} must be at least 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"--max-cpu-loras ({self.max_cpu_loras}) must be >= --max-loras ({self.max_loras})")

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras or self.max_loras
