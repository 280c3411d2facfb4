"""A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) read and checked against the model
it is to run on: every tensor's shape against the base projection's, the rank against --max-lora-rank. Anything the
engine would not apply exactly as PEFT computes it is refused with one line, never ignored: DoRA, biases, embedding
or lm_head adapters, modules_to_save, and MoE experts reached through target_parameters."""
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from atomlite.lora.request import LoRARequest
from atomlite.lora.targets import Target

PEFT_PREFIX = "base_model.model."
WEIGHTS = ("lora_A.weight", "lora_B.weight")


class AdapterNotFound(ValueError):
    """The adapter's folder or one of its files is missing."""


@dataclass
class LoRAAdapter:
    """An adapter ready to load into a slot: checkpoint module name -> (A [r, in], B [out, r] times its scaling),
    float32 on the host. key names its content (config and weights), for the prefix cache."""
    request: LoRARequest
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    rank: int
    key: bytes


def _files(request: LoRARequest) -> tuple[Path, Path]:
    folder = Path(request.lora_path).expanduser()
    config, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not folder.is_dir():
        raise AdapterNotFound(f"LoRA {request.lora_name!r}: no such folder {folder}")
    if not config.is_file():
        raise AdapterNotFound(f"LoRA {request.lora_name!r}: {folder} has no adapter_config.json")
    if not weights.is_file():
        other = " (adapter_model.bin is not read: save with safe_serialization=True)" if (
            folder / "adapter_model.bin").exists() else ""
        raise AdapterNotFound(f"LoRA {request.lora_name!r}: {folder} has no adapter_model.safetensors{other}")
    return config, weights


def _read_config(request: LoRARequest, path: Path, data: bytes) -> dict:
    try:
        config = json.loads(data.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"LoRA {request.lora_name!r}: {path} is not JSON ({e})") from None
    name = request.lora_name
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    if config.get("target_parameters"):
        raise ValueError(f"LoRA {name!r} adapts parameters {config['target_parameters']} (target_parameters: MoE "
                         f"experts); atomlite serves adapters on the attention and MLP projections only")
    refused = {"use_dora": "DoRA", "modules_to_save": "modules_to_save", "alpha_pattern": "per-module alphas",
               "lora_bias": "LoRA biases", "alora_invocation_tokens": "activated LoRA (aLoRA)",
               "trainable_token_indices": "trained token embeddings", "layer_replication": "layer replication",
               "use_qalora": "QA-LoRA", "use_bdlora": "block-diagonal LoRA", "arrow_config": "Arrow routing",
               "kasa_config": "KaSA", "monteclora_config": "MonteCLoRA"}
    for field, what in refused.items():
        if config.get(field):
            raise ValueError(f"LoRA {name!r} uses {what} ({field} in adapter_config.json), which atomlite does not "
                             f"serve")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA {name!r} trains biases (bias={config['bias']!r}); atomlite serves bias='none' only")
    return config


def _scaling(config: dict, rank: int) -> float:
    alpha = config.get("lora_alpha", 8)
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _pairs(request: LoRARequest, tensors: dict[str, torch.Tensor], alias) -> dict[str, dict[str, torch.Tensor]]:
    """checkpoint module name -> {"lora_A.weight": A, "lora_B.weight": B}; any other tensor refused."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        suffix = next((s for s in WEIGHTS if key.endswith(f".{s}")), None)
        if suffix is None or not key.startswith(PEFT_PREFIX):
            raise ValueError(f"LoRA {request.lora_name!r}: tensor {key} is not a LoRA A or B weight of a projection "
                             f"(atomlite serves lora_A/lora_B weights only)")
        module = alias(key[len(PEFT_PREFIX):-len(suffix) - 1])
        pairs.setdefault(module, {})[suffix] = tensor
    for module, pair in pairs.items():
        if len(pair) != 2:
            raise ValueError(f"LoRA {request.lora_name!r}: {module} has {', '.join(pair)} without its pair")
    return pairs


def _checked(request: LoRARequest, module: str, a: torch.Tensor, b: torch.Tensor, target: Target | None,
             max_rank: int) -> int:
    name = request.lora_name
    if target is None:
        raise ValueError(f"LoRA {name!r} targets {module}, which is not a projection this model adapts (an adapter "
                         f"for another base model, or a module such as the embeddings or a vision tower)")
    rank = a.shape[0]
    if a.dim() != 2 or b.dim() != 2 or b.shape[1] != rank:
        raise ValueError(f"LoRA {name!r}: {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, which "
                         f"are not (r, in) and (out, r)")
    want_a, want_b = (rank, target.in_features), (target.out_features, rank)
    if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
        raise ValueError(f"LoRA {name!r}: {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, but the "
                         f"base model needs {want_a} and {want_b}: the adapter was trained for another base model")
    if rank > max_rank:
        raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {max_rank}.")
    return rank


def read_adapter(request: LoRARequest, targets: dict[str, Target], max_rank: int, alias=lambda name: name
                 ) -> LoRAAdapter:
    """The adapter of request checked against targets (lora.targets); ValueError (AdapterNotFound for a missing
    file) naming what is wrong. alias: the model's checkpoint prefix renames (loader's)."""
    config_path, weights_path = _files(request)
    config_bytes = config_path.read_bytes()
    config = _read_config(request, config_path, config_bytes)
    try:
        weight_bytes = weights_path.read_bytes()  # once: for the tensors and the content key
        tensors = load(weight_bytes)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"LoRA {request.lora_name!r}: {weights_path} is not a readable safetensors file "
                         f"({e})") from None
    if not tensors:
        raise ValueError(f"LoRA {request.lora_name!r}: {weights_path} holds no tensor")
    weights, largest = {}, 0
    for module, pair in _pairs(request, tensors, alias).items():
        a, b = pair["lora_A.weight"], pair["lora_B.weight"]
        rank = _checked(request, module, a, b, targets.get(module), max_rank)
        weights[module] = (a.float(), b.float() * _scaling(config, rank))
        largest = max(largest, rank)
    digest = hashlib.sha256(config_bytes)
    digest.update(weight_bytes)
    return LoRAAdapter(request, weights, largest, digest.digest())
