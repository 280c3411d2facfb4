"""compressed-tensors `quantization_config` (quant_method "compressed-tensors", llm-compressor's output) parsed
once into per-layer FP8 specs.

A module is quantized by the first config group whose `targets` match it (a class name such as "Linear", an exact
module name, or `re:` regex), unless `ignore` lists it (same forms). atomlite runs `float-quantized` 8-bit float
weights per tensor, per channel or in 2-D blocks, with no activation quantization (W8A16), static per-tensor
inputs, or dynamic per-token / per-group inputs. Anything else is refused, naming the config field.
"""
import re
from dataclasses import dataclass

from atomlite.quant.fp8 import FP8Spec
from atomlite.quant.quark import PACKED_MODULES, _name_forms

FORMAT = "float-quantized"
SUPPORTED = ("format float-quantized: 8-bit float weights (strategy tensor, channel or block), inputs none, "
             "static per tensor, or dynamic per token / per group")
# atomlite asks for the specs of Linears (and of per-expert projections, Linears in the producing model)
LAYER_CLASSES = ("Linear",)


class Unsupported(ValueError):
    pass


def _check_float8(args: dict, field: str) -> None:
    if args.get("type") != "float" or args.get("num_bits") != 8:
        raise Unsupported(f"{field} is {args.get('type')} {args.get('num_bits')}-bit; atomlite runs {SUPPORTED}")
    if args.get("symmetric") is False:
        raise Unsupported(f"{field}.symmetric is false; atomlite runs symmetric fp8 only")
    if args.get("scale_dtype") not in (None, "torch.float32", "torch.bfloat16", "torch.float16"):
        raise Unsupported(f"{field}.scale_dtype {args['scale_dtype']} is not supported (float scales only)")


def _weight(args: dict, field: str) -> tuple[str, tuple[int, int]]:
    _check_float8(args, field)
    strategy = args.get("strategy")
    if args.get("dynamic"):
        raise Unsupported(f"{field}.dynamic is true; atomlite loads static (stored) weight scales")
    if strategy in ("tensor", "channel"):
        return strategy, (128, 128)
    if strategy == "block":
        block = tuple(args.get("block_structure") or ())
        if len(block) != 2 or min(block) <= 0:
            raise Unsupported(f"{field}.block_structure {args.get('block_structure')} is not [rows, columns]")
        return "block", block
    raise Unsupported(f"{field}.strategy {strategy!r} is not supported; atomlite runs tensor, channel or block")


def _activation(args: dict | None, field: str) -> tuple[str | None, int]:
    if not args:
        return None, 128
    _check_float8(args, field)
    strategy, dynamic = args.get("strategy"), args.get("dynamic")
    if not dynamic and strategy == "tensor":
        return "static", 128
    if dynamic is True and strategy == "token":
        return "token", 128
    if dynamic is True and strategy == "group" and (args.get("group_size") or 0) > 0:
        return "group", args["group_size"]
    raise Unsupported(f"{field} strategy {strategy!r} dynamic={dynamic!r} is not supported; atomlite runs static "
                      f"per-tensor or dynamic per-token / per-group inputs")


def _scheme(name: str, group: dict) -> FP8Spec:
    field = f"quantization_config.config_groups.{name}"
    if group.get("output_activations"):
        raise Unsupported(f"{field}.output_activations is set; atomlite does not quantize outputs")
    if group.get("format") not in (None, FORMAT):
        raise Unsupported(f"{field}.format {group['format']!r} is not supported; atomlite runs {FORMAT}")
    if not group.get("weights"):
        raise Unsupported(f"{field}.weights is empty (activation-only quantization); atomlite runs {SUPPORTED}")
    weight, block = _weight(group["weights"], f"{field}.weights")
    activation, group_size = _activation(group.get("input_activations"), f"{field}.input_activations")
    return FP8Spec(weight, activation, block, group_size, "compressed-tensors")


def _matches(target: str, name: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target in LAYER_CLASSES or name == target


@dataclass(frozen=True)
class CompressedTensorsConfig:
    groups: tuple[tuple[tuple[str, ...], FP8Spec], ...]
    ignore: tuple[str, ...]

    @classmethod
    def from_hf_config(cls, hf_config: dict) -> "CompressedTensorsConfig":
        """From a checkpoint's config.json dict or its quantization_config; Unsupported (a ValueError) names the
        field atomlite does not run."""
        qc = hf_config.get("quantization_config", hf_config)
        if qc.get("quant_method") != "compressed-tensors":
            raise ValueError(f"quant_method {qc.get('quant_method')!r} is not 'compressed-tensors'")
        if qc.get("format") not in (None, FORMAT, "mixed-precision"):
            raise Unsupported(f"quantization_config.format {qc.get('format')!r} is not supported; atomlite runs "
                              f"{SUPPORTED}")
        for key in ("kv_cache_scheme", "transform_config"):
            if qc.get(key):
                raise Unsupported(f"quantization_config.{key} is set; atomlite does not run it (yet)")
        if (qc.get("sparsity_config") or {}).get("format") not in (None, "dense"):
            raise Unsupported("quantization_config.sparsity_config is set; atomlite runs dense weights only")
        groups = qc.get("config_groups") or {}
        if not groups:
            raise Unsupported("quantization_config.config_groups is empty")
        return cls(groups=tuple((tuple(g.get("targets") or ()), _scheme(n, g)) for n, g in groups.items()),
                   ignore=tuple(qc.get("ignore") or ()))

    def is_ignored(self, module_name: str) -> bool:
        return any(self._listed(entry, form) for entry in self.ignore for form in _name_forms(module_name))

    @staticmethod
    def _listed(entry: str, name: str) -> bool:
        if entry.startswith("re:"):
            return re.match(entry[3:], name) is not None
        return name == entry or name.startswith(entry + ".")

    def spec_for(self, module_name: str) -> FP8Spec | None:
        """The spec of the Linear module_name, or None when it stays unquantized; a fused projection
        (`qkv_proj`, `gate_up_proj`) takes its shards' common spec (ValueError when they differ)."""
        prefix, _, leaf = module_name.rpartition(".")
        shards = PACKED_MODULES.get(leaf)
        if shards is None:
            return self._spec_of_one(module_name)
        specs = {s: self._spec_of_one(f"{prefix}.{s}" if prefix else s) for s in shards}
        if len(set(specs.values())) > 1:
            raise ValueError(f"{module_name} fuses layers quantized differently ({specs}); it cannot run as one layer")
        return specs[shards[0]]

    def _spec_of_one(self, module_name: str) -> FP8Spec | None:
        if self.is_ignored(module_name):
            return None
        for targets, spec in self.groups:
            if any(_matches(t, form) for t in targets for form in _name_forms(module_name)):
                return spec
        return None
