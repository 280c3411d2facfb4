"""vLLM's LoRARequest: which adapter a request runs with."""
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """lora_name: the adapter's name (the server's model name for it); lora_int_id: a positive id, unique per
    adapter; lora_path: the folder with adapter_config.json and adapter_model.safetensors (PEFT's)."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be > 0, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError(f"LoRA {self.lora_name!r} has no lora_path")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id
