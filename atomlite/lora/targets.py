"""Which projections of a model take adapters, and what an adapter's tensors for each must look like.

A model declares `lora_targets`: the checkpoint names of the projections adapters may change (q_proj, ..., down_proj
for Gemma 4), under `lora_prefix` (its decoder layers, not a vision tower's). Each projection serving them (a fused one serves several, one slice each: packed_weights) gets
LoRASlots; an adapter's A and B for checkpoint module `model.layers.3.self_attn.k_proj` then go to slice 1 of
`model.layers.3.self_attn.qkv_proj`. Shapes are the whole model's (the checkpoint's), whatever this rank keeps."""
from dataclasses import dataclass

import torch
from torch import nn

from atomlite.distributed import Shard
from atomlite.errors import ConfigError
from atomlite.model_ops.linear import Linear
from atomlite.model_ops.lora import LoRASlots, RowSlots


@dataclass(frozen=True)
class Target:
    """One checkpoint projection an adapter may change: the module serving it and its slice there."""
    module: str
    slice: int
    in_features: int  # the whole model's
    out_features: int
    rows: Shard  # the output rows this rank keeps of it
    columns: Shard  # the input columns this rank keeps


def _served_names(model: nn.Module, path: str, slices: int) -> list[str]:
    """The checkpoint module names the projection at path serves, one per slice (packed_weights: checkpoint
    fragment -> (fused fragment, slice))."""
    by_slice = {shard: path[:-len(fused)] + part for part, (fused, shard) in getattr(model, "packed_weights", {}).items()
                if path.endswith(f".{fused}")}
    return [by_slice[i] for i in range(slices)] if by_slice else [path]


def find_targets(model: nn.Module) -> dict[str, tuple[str, nn.Module]]:
    """Checkpoint module name -> (module path, module) for every projection adapters may change; quantized
    projections are refused (adapters run beside unquantized weights only)."""
    declared = getattr(model, "lora_targets", None)
    if not declared:
        raise ConfigError(f"{type(model).__name__} declares no LoRA targets: --enable-lora is not supported for it")
    found = {}
    for path, module in model.named_modules():
        shards = getattr(module, "output_shards", None)
        names = _served_names(model, path, len(shards)) if shards else [path]
        if not path.startswith(model.lora_prefix) or not any(n.rsplit(".", 1)[-1] in declared for n in names):
            continue
        if not isinstance(module, Linear):
            raise ConfigError(f"--enable-lora: {path} is {type(module).__name__} (a quantized projection); adapters "
                              f"apply to unquantized checkpoints only")
        for name in names:
            found[name] = (path, module)
    return found


def attach_slots(model: nn.Module, num_slots: int, rank: int, rows: RowSlots) -> dict[str, Target]:
    """LoRASlots on every target projection (zero: every slot is the base model until an adapter loads); returns the
    targets by checkpoint module name."""
    targets = {}
    for name, (path, module) in find_targets(model).items():
        shards = module.output_shards
        columns = getattr(module, "input_shard", Shard(0, module.in_features, module.in_features))
        if module.lora is None:
            module.lora = LoRASlots(module.in_features, [s.size for s in shards], num_slots, rank, rows)
        names = _served_names(model, path, len(shards))
        i = names.index(name)
        targets[name] = Target(path, i, columns.total, shards[i].total, shards[i], columns)
    return targets


def lora_modules(model: nn.Module) -> dict[str, LoRASlots]:
    return {path: module.lora for path, module in model.named_modules()
            if isinstance(module, Linear) and module.lora is not None}


def write_slot(model: nn.Module, targets: dict[str, Target], slot: int,
               weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Adapter weights (checkpoint module name -> A [r, in], B [out, r] with its scaling) into slot, each narrowed to
    what this rank keeps; every other target's slot cleared."""
    modules = lora_modules(model)
    for lora in modules.values():
        lora.clear(slot)
    for name, (a, b) in weights.items():
        target = targets[name]
        lora = modules[target.module]
        r, rank = a.shape[0], lora.rank
        cols, rows = target.columns, target.rows
        offset = sum(lora.slice_sizes[:target.slice])
        lora.a[slot, target.slice * rank:target.slice * rank + r].copy_(a[:, cols.start:cols.stop])
        lora.b[slot, offset:offset + rows.size, :r].copy_(b[rows.start:rows.stop])
