"""HF architecture name -> atomlite model class: the one table. Models are named by module path and imported on
first use, so config and the engine read this table without importing the models package."""
import importlib

from atomlite.errors import ConfigError

MODELS = {
    "Gemma4ForCausalLM": "atomlite.models.gemma4:Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration": "atomlite.models.gemma4:Gemma4ForCausalLM",
}


def model_class(architecture: str):
    if architecture not in MODELS:
        raise ConfigError(f"architecture {architecture} is not supported; supported: {', '.join(MODELS)}")
    module, name = MODELS[architecture].split(":")
    return getattr(importlib.import_module(module), name)
