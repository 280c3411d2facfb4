"""HF architecture name -> atomlite model class: the one table. Models are named by module path and imported on
first use (the first config.json of their architecture), so the engine reads this table without importing every
model.

A model class declares what is its own, and the engine reads only that:
- `parse_config(raw) -> config.ModelLayout`: its config.json's text config, layer attention kinds, RoPE per kind,
  vision tower;
- `kv_specs(dtype)`, `attention_layers()`, `forward`, `compute_logits`, `logits_weight` (the tensor the logits
  GEMM reads, for rooflines);
- weight names: each parameter's weight_loader, `packed_weights`, `checkpoint_aliases`, `skipped_prefixes`,
  `ignored_weight(name)`;
- `mtp_assistant` (optional): the module of its MTP drafter (load_assistant_spec, check_compatible,
  build_assistant; construct_assistant, its modules without weights, for the compile gate's meta-device build)."""
import importlib

from atomlite.errors import ConfigError

MODELS = {
    "Gemma4ForCausalLM": "atomlite.models.gemma4:Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration": "atomlite.models.gemma4:Gemma4ForCausalLM",
    "Gemma3ForCausalLM": "atomlite.models.gemma3:Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration": "atomlite.models.gemma3:Gemma3ForCausalLM",  # its text model alone
}


def model_class(architecture: str):
    if architecture not in MODELS:
        raise ConfigError(f"architecture {architecture} is not supported; supported: {', '.join(MODELS)}")
    module, name = MODELS[architecture].split(":")
    return getattr(importlib.import_module(module), name)


def mtp_assistant(architecture: str):
    """The module that builds architecture's MTP drafter (speculative_config method "mtp")."""
    module = getattr(model_class(architecture), "mtp_assistant", None)
    if module is None:
        raise ConfigError(f"speculative_config method 'mtp': {architecture} has no MTP assistant in atomlite; use "
                          f"method 'ngram'")
    return importlib.import_module(module)
