"""Tiny PEFT LoRA adapters on the tiny Gemma 4 checkpoints (tiny_models), made with PEFT itself: the reference
atomlite's adapters are compared with. Every A and B is random (PEFT's default B of zero would hide bugs)."""
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
# two adapters of different rank, alpha and targets (one rsLoRA), as the parity tests batch them
ADAPTERS = {"first": dict(r=4, lora_alpha=8, target_modules=ALL),
            "second": dict(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                           use_rslora=True)}


def randomize_adapter(model: torch.nn.Module, name: str, seed: int, std: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if f".{name}." in key and "lora_" in key:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build_adapters(base: torch.nn.Module, out: Path, adapters: dict = ADAPTERS, seed: int = 0) -> PeftModel:
    """Saves each adapter of `adapters` (name -> LoraConfig fields) to out / name; returns the float32 PEFT model
    holding them all (set_adapter picks one, disable_adapter() gives the base)."""
    peft_model = None
    for i, (name, fields) in enumerate(adapters.items()):
        config = LoraConfig(**fields)
        if peft_model is None:
            peft_model = get_peft_model(base, config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
        randomize_adapter(peft_model, name, seed + i)
    peft_model.save_pretrained(out)  # an adapter not named "default" goes to out / its name
    return peft_model.float().eval()
