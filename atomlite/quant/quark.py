"""Quark `quantization_config` (quant_method "quark") parsed once into a per-layer spec for atomlite's Linears.

A module's config is found as Quark and vLLM do: excluded -> unquantized; else the first `layer_quant_config`
pattern that matches; else a Linear entry of `layer_type_quant_config`; else `global_quant_config`.
Names are atomlite's (`model.layers.0.self_attn.q_proj`); a checkpoint written from a multimodal model names
the same module `model.language_model.layers.0...`, and patterns match either form.
"""
import fnmatch
import re
from dataclasses import dataclass

from atomlite.quant.fp8 import FP8Spec
from atomlite.quant.mxfp4 import BLOCK

SUPPORTED = ("MXFP4 weights (fp4, per_group 32 along K, e8m0 scales, static) with either no input quantization or "
             "dynamic MXFP4 inputs (scale_calculation_mode even); fp8_e4m3 weights (per_tensor or per_channel, "
             "static) with no input quantization, static per_tensor or dynamic per-token (per_channel ch_axis 1) "
             "fp8_e4m3 inputs")

# atomlite's fused projections and the checkpoint modules they are made of.
PACKED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

_LANGUAGE_MODEL_PREFIX = "model.language_model."


@dataclass(frozen=True, slots=True)
class LinearQuantSpec:
    """How one Linear is stored and run. Weights are always MXFP4: uint8 [N, K/2] + e8m0 uint8 [N, K/32]."""
    dynamic_fp4_input: bool
    weight_dtype: str = "fp4"
    block_size: int = BLOCK
    scale_format: str = "e8m0"


@dataclass(frozen=True, slots=True)
class _Unsupported:
    scheme: str


@dataclass(frozen=True, slots=True)
class KVCacheQuant:
    """Quark's fp8 KV cache: static per-tensor e4m3 scales (amax / 448), exported per layer as
    `self_attn.k_proj.output_scale` / `v_proj.output_scale`. post_rope (Quark's kv_cache_post_rope): observed on
    what the cache holds (K after k_norm and RoPE, V after v_norm); otherwise on the raw k_proj / v_proj outputs,
    K and V merged to one value."""
    post_rope: bool


KV_CACHE_SCHEME = "fp8_e4m3 per_tensor static (Quark kv_cache_scheme fp8)"


def _kv_cache_quant(qc: dict) -> KVCacheQuant | None:
    entries = qc.get("kv_cache_quant_config") or {}
    for pattern, spec in entries.items():
        output = (spec or {}).get("output_tensors") or {}
        if (output.get("dtype"), output.get("qscheme"), bool(output.get("is_dynamic"))) != ("fp8_e4m3", "per_tensor",
                                                                                          False):
            raise ValueError(f"quark kv-cache quantization {pattern!r} ({_describe(output)}) is not supported; "
                             f"atomlite runs {KV_CACHE_SCHEME}")
    return KVCacheQuant(post_rope=bool(qc.get("kv_cache_post_rope"))) if entries else None


def checkpoint_kv_cache(hf_config: dict) -> KVCacheQuant | None:
    """The fp8 KV cache a checkpoint's Quark quantization_config declares, if any."""
    qc = hf_config.get("quantization_config") or {}
    return _kv_cache_quant(qc) if qc.get("quant_method") == "quark" else None


def _without_kv_output(config: dict | None) -> dict | None:
    """A k_proj / v_proj layer config whose output quantization is the KV cache's (kv_cache_quant_config says so):
    the Linear itself runs without it."""
    return {**config, "output_tensors": None} if config else config


def _describe(tensor_config: dict) -> str:
    keys = ("dtype", "qscheme", "group_size", "scale_format", "is_dynamic")
    return " ".join(f"{k}={tensor_config.get(k)}" for k in keys if tensor_config.get(k) is not None)


def _is_mxfp4(tensor_config: dict, dynamic: bool) -> bool:
    return (tensor_config.get("dtype") == "fp4" and tensor_config.get("qscheme") == "per_group"
            and tensor_config.get("group_size") == BLOCK and tensor_config.get("ch_axis", -1) == -1
            and tensor_config.get("scale_format") == "e8m0" and bool(tensor_config.get("is_dynamic")) == dynamic
            and tensor_config.get("scale_calculation_mode") in (None, "even")
            and tensor_config.get("mx_element_dtype") is None)


def _fp8_weight(weight: dict) -> str | None:
    if weight.get("dtype") != "fp8_e4m3" or weight.get("is_dynamic") or weight.get("symmetric") is False:
        return None
    if weight.get("qscheme") == "per_tensor":
        return "tensor"
    if weight.get("qscheme") == "per_channel" and weight.get("ch_axis", 0) == 0:
        return "channel"
    return None


def _fp8_input(inputs: dict | None) -> tuple[bool, str | None]:
    """(supported, activation) of an fp8 Linear's input_tensors config."""
    if inputs is None:
        return True, None
    if inputs.get("dtype") != "fp8_e4m3" or inputs.get("symmetric") is False:
        return False, None
    dynamic, qscheme = bool(inputs.get("is_dynamic")), inputs.get("qscheme")
    if not dynamic and qscheme == "per_tensor":
        return True, "static"
    if dynamic and qscheme == "per_channel" and inputs.get("ch_axis") in (1, -1):
        return True, "token"
    return False, None


def _parse_fp8(weight: dict, inputs: dict | None) -> FP8Spec | _Unsupported:
    strategy = _fp8_weight(weight)
    if strategy is None:
        return _Unsupported(f"weight {_describe(weight)}")
    supported, activation = _fp8_input(inputs)
    if not supported:
        return _Unsupported(f"input {_describe(inputs)} with fp8 weights")
    return FP8Spec(strategy, activation, fmt="quark")


def _parse_layer_config(config: dict | None) -> LinearQuantSpec | FP8Spec | _Unsupported | None:
    """One QLayerConfig dict -> the spec it stands for; None when it quantizes nothing."""
    if not config:
        return None
    weight, inputs = config.get("weight"), config.get("input_tensors")
    for role in ("output_tensors", "bias"):
        if config.get(role):
            return _Unsupported(f"{role} quantization ({_describe(config[role])})")
    if isinstance(weight, list) or isinstance(inputs, list):
        return _Unsupported("multi-level (sequential) quantization")
    if weight is None:
        return _Unsupported(f"input-only quantization ({_describe(inputs)})") if inputs else None
    if weight.get("dtype") == "fp8_e4m3":
        return _parse_fp8(weight, inputs)
    if not _is_mxfp4(weight, dynamic=False):
        return _Unsupported(f"weight {_describe(weight)}")
    if inputs is not None and not _is_mxfp4(inputs, dynamic=True):
        return _Unsupported(f"input {_describe(inputs)} with MXFP4 weights")
    return LinearQuantSpec(dynamic_fp4_input=inputs is not None)


def _name_forms(name: str) -> tuple[str, ...]:
    if name.startswith(_LANGUAGE_MODEL_PREFIX):
        return name, "model." + name[len(_LANGUAGE_MODEL_PREFIX):]
    if name.startswith("model."):
        return name, _LANGUAGE_MODEL_PREFIX + name[len("model."):]
    return (name,)


def _excluded_by(entry: str, name: str) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if any(c in entry for c in "*?["):
        return fnmatch.fnmatchcase(name, entry)
    return name == entry or name.startswith(entry + ".")


@dataclass(frozen=True)
class QuarkConfig:
    global_spec: LinearQuantSpec | FP8Spec | _Unsupported | None
    layer_specs: tuple[tuple[str, LinearQuantSpec | FP8Spec | _Unsupported | None], ...]
    linear_type_spec: LinearQuantSpec | FP8Spec | _Unsupported | None
    exclude: tuple[str, ...]
    kv_cache: KVCacheQuant | None = None

    @classmethod
    def from_hf_config(cls, hf_config: dict) -> "QuarkConfig":
        """From a checkpoint's config.json dict, or its `quantization_config` sub-dict."""
        qc = hf_config.get("quantization_config", hf_config)
        if qc.get("quant_method") != "quark":
            raise ValueError(f"quantization_config has quant_method {qc.get('quant_method')!r}, expected 'quark'")
        if qc.get("softmax_quant_spec"):
            raise ValueError(f"quark softmax quantization ({qc['softmax_quant_spec']}) is not supported; "
                             f"atomlite runs {SUPPORTED}")
        linear_types = [spec for key, spec in (qc.get("layer_type_quant_config") or {}).items()
                        if "Linear" in key]
        kv_patterns = set(qc.get("kv_cache_quant_config") or {})
        layers = qc.get("layer_quant_config") or {}
        return cls(
            global_spec=_parse_layer_config(qc.get("global_quant_config")),
            layer_specs=tuple((p, _parse_layer_config(_without_kv_output(c) if p in kv_patterns else c))
                              for p, c in layers.items()),
            linear_type_spec=_parse_layer_config(linear_types[0]) if linear_types else None,
            exclude=tuple(qc.get("exclude") or ()),
            kv_cache=_kv_cache_quant(qc),
        )

    def is_excluded(self, module_name: str) -> bool:
        return any(_excluded_by(e, form) for e in self.exclude for form in _name_forms(module_name))

    def spec_for(self, module_name: str) -> LinearQuantSpec | FP8Spec | None:
        """The quantization of the Linear `module_name`; None when it stays unquantized.

        A fused projection (`...qkv_proj`, `...gate_up_proj`) takes its shards' common spec. Raises ValueError
        naming the scheme and the layer when the checkpoint uses something atomlite does not run.
        """
        prefix, _, leaf = module_name.rpartition(".")
        shards = PACKED_MODULES.get(leaf)
        if shards is None:
            return self._spec_of_one(module_name)
        names = [f"{prefix}.{s}" if prefix else s for s in shards]
        specs = {name: self._spec_of_one(name) for name in names}
        if len(set(specs.values())) > 1:
            listed = ", ".join(f"{n}: {s}" for n, s in specs.items())
            raise ValueError(f"{module_name} fuses layers quantized differently ({listed}); "
                             f"it cannot run as one layer")
        return specs[names[0]]

    def _spec_of_one(self, module_name: str) -> LinearQuantSpec | FP8Spec | None:
        forms = _name_forms(module_name)
        if self.is_excluded(module_name):
            return None
        where, spec = "global_quant_config", self.global_spec
        for pattern, layer_spec in self.layer_specs:
            if any(fnmatch.fnmatchcase(f, pattern) for f in forms):
                where, spec = f"layer_quant_config[{pattern!r}]", layer_spec
                break
        else:
            if self.linear_type_spec is not None:
                where, spec = "layer_type_quant_config", self.linear_type_spec
        if isinstance(spec, _Unsupported):
            raise ValueError(f"{module_name}: quark scheme {spec.scheme} (from {where}) is not supported; "
                             f"atomlite runs {SUPPORTED}")
        return spec
