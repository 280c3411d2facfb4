"""LoRA adapters served on one base model (PEFT's format), batched together: docs/LORA.md."""
from atomlite.lora.request import LoRARequest

__all__ = ["LoRARequest"]
