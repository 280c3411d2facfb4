"""Quark quantization_config dicts as Quark 0.13 writes them (shared/docs/QUARK_MXFP4.md), for tests that build one."""
import copy

MXFP4_TENSOR = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "is_dynamic": False,
                "scale_format": "e8m0", "scale_calculation_mode": "even", "scale_type": "float",
                "round_method": "half_even", "observer_cls": "PerBlockMXObserver", "symmetric": None,
                "block_size": None, "mx_element_dtype": None, "is_scale_quant": False, "zero_point_type": "int32"}
MXFP4_LAYER = {"weight": MXFP4_TENSOR, "input_tensors": {**MXFP4_TENSOR, "is_dynamic": True},
               "output_tensors": None, "bias": None, "target_device": None}

def quark_config(**overrides) -> dict:
    config = {"quant_method": "quark", "quant_mode": "eager_mode", "version": "0.13",
              "global_quant_config": copy.deepcopy(MXFP4_LAYER), "layer_quant_config": {},
              "layer_type_quant_config": {}, "exclude": ["lm_head"], "kv_cache_quant_config": {},
              "kv_cache_post_rope": False, "softmax_quant_spec": None, "algo_config": None}
    return {"architectures": ["Gemma4ForCausalLM"], "quantization_config": {**config, **overrides}}
