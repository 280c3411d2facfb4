"""Parsing Quark quantization_config dicts (the key layout Quark 0.13 writes, shared/docs/QUARK_MXFP4.md), including
forms Quark itself does not export (prefix and `re:` excludes) that other tools write into the same field.
A config exported by Quark itself is parsed in test_quark_reference.py."""

import pytest

from atomlite.quant.quark import KVCacheQuant, LinearQuantSpec, QuarkConfig
from quark_configs import MXFP4_LAYER, MXFP4_TENSOR, quark_config

FP8_OUTPUT = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False,
              "observer_cls": "PerTensorMinMaxObserver"}


DYNAMIC = LinearQuantSpec(dynamic_fp4_input=True)
WEIGHT_ONLY = LinearQuantSpec(dynamic_fp4_input=False)


def test_global_mxfp4_gives_dynamic_fp4_inputs_and_lm_head_stays_unquantized():
    config = QuarkConfig.from_hf_config(quark_config())
    assert config.spec_for("model.layers.0.self_attn.q_proj") == DYNAMIC
    assert config.spec_for("lm_head") is None


@pytest.mark.parametrize("entry", [
    "model.layers.1.mlp.down_proj",                   # exact name
    "model.language_model.layers.1.mlp.down_proj",    # as a multimodal checkpoint names it
    "model.layers.1.mlp",                             # prefix (a parent module)
    "*layers.1.mlp.*",                                # glob
    r"re:.*layers\.1\.mlp\.(gate|up|down)_proj",      # regex
])
def test_every_exclude_form_leaves_the_layer_unquantized(entry):
    config = QuarkConfig.from_hf_config(quark_config(exclude=[entry]))
    assert config.spec_for("model.layers.1.mlp.down_proj") is None
    assert config.spec_for("model.layers.11.mlp.down_proj") == DYNAMIC
    assert config.spec_for("model.layers.1.mlp_extra.down_proj") == DYNAMIC


def test_layer_pattern_overrides_global_config():
    weight_only = {**MXFP4_LAYER, "input_tensors": None}
    config = QuarkConfig.from_hf_config(quark_config(layer_quant_config={"*v_proj": weight_only}))
    assert config.spec_for("model.layers.3.self_attn.v_proj") == WEIGHT_ONLY
    assert config.spec_for("model.layers.3.self_attn.k_proj") == DYNAMIC


def test_patterns_written_for_multimodal_names_match_atomlite_names():
    weight_only = {**MXFP4_LAYER, "input_tensors": None}
    config = QuarkConfig.from_hf_config(quark_config(
        layer_quant_config={"model.language_model.layers.0.*": weight_only},
        exclude=["*vision_tower*", "model.language_model.layers.2.self_attn.o_proj"]))
    assert config.spec_for("model.layers.0.mlp.up_proj") == WEIGHT_ONLY
    assert config.spec_for("model.layers.2.self_attn.o_proj") is None
    assert config.spec_for("model.language_model.layers.2.self_attn.o_proj") is None


def test_fused_projection_takes_the_common_spec_of_its_shards_and_refuses_a_mix():
    weight_only = {**MXFP4_LAYER, "input_tensors": None}
    config = QuarkConfig.from_hf_config(quark_config(layer_quant_config={"*v_proj": weight_only},
                                                     exclude=["*layers.2.mlp.gate_proj", "*layers.2.mlp.up_proj"]))
    assert config.spec_for("model.layers.0.mlp.gate_up_proj") == DYNAMIC
    assert config.spec_for("model.layers.2.mlp.gate_up_proj") is None
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.qkv_proj fuses"):
        config.spec_for("model.layers.0.self_attn.qkv_proj")


@pytest.mark.parametrize("change, scheme", [
    ({"weight": {**MXFP4_TENSOR, "dtype": "fp8_e4m3", "qscheme": "per_tensor"}}, "input dtype=fp4 qscheme=per_group"
                                                                                    " group_size=32"),
    ({"weight": {**MXFP4_TENSOR, "dtype": "fp8_e4m3", "qscheme": "per_group"}}, "weight dtype=fp8_e4m3"),
    ({"weight": {**MXFP4_TENSOR, "dtype": "int4", "group_size": 128}}, "weight dtype=int4"),
    ({"output_tensors": FP8_OUTPUT}, "output_tensors quantization (dtype=fp8_e4m3"),
    ({"input_tensors": {**MXFP4_TENSOR, "is_dynamic": False}}, "input dtype=fp4 qscheme=per_group"),
])
def test_unsupported_scheme_names_the_scheme_and_the_layer(change, scheme):
    config = QuarkConfig.from_hf_config(quark_config(layer_quant_config={"*o_proj": {**MXFP4_LAYER, **change}}))
    assert config.spec_for("model.layers.0.self_attn.q_proj") == DYNAMIC
    with pytest.raises(ValueError, match="model.layers.4.self_attn.o_proj") as error:
        config.spec_for("model.layers.4.self_attn.o_proj")
    assert scheme in str(error.value) and "layer_quant_config['*o_proj']" in str(error.value)


@pytest.mark.parametrize("post_rope", [False, True])
def test_an_fp8_kv_cache_is_read_and_the_kv_projections_run_as_their_weights_say(post_rope):
    """Quark writes the KV cache's fp8 output quantization into the k_proj / v_proj layer configs too: it belongs to
    the cache, not to the Linears."""
    kv = {**MXFP4_LAYER, "output_tensors": FP8_OUTPUT}
    config = QuarkConfig.from_hf_config(quark_config(layer_quant_config={"*k_proj": kv, "*v_proj": kv},
                                                     kv_cache_quant_config={"*k_proj": kv, "*v_proj": kv},
                                                     kv_cache_post_rope=post_rope))
    assert config.kv_cache == KVCacheQuant(post_rope=post_rope)
    assert config.spec_for("model.layers.0.self_attn.k_proj") == DYNAMIC
    assert config.spec_for("model.layers.0.self_attn.qkv_proj") == DYNAMIC
    assert QuarkConfig.from_hf_config(quark_config()).kv_cache is None


def test_a_kv_cache_alone_leaves_every_linear_unquantized():
    kv = {"weight": None, "input_tensors": None, "output_tensors": FP8_OUTPUT, "bias": None}
    config = QuarkConfig.from_hf_config(quark_config(global_quant_config=None,
                                                     layer_quant_config={"*k_proj": kv, "*v_proj": kv},
                                                     kv_cache_quant_config={"*k_proj": kv, "*v_proj": kv}))
    assert config.kv_cache == KVCacheQuant(post_rope=False)
    assert config.spec_for("model.layers.0.self_attn.qkv_proj") is None


@pytest.mark.parametrize("change", [{"dtype": "fp8_e5m2"}, {"qscheme": "per_channel"}, {"is_dynamic": True}])
def test_other_kv_cache_schemes_are_refused_by_name(change):
    kv = {**MXFP4_LAYER, "output_tensors": {**FP8_OUTPUT, **change}}
    with pytest.raises(ValueError, match=r"quark kv-cache quantization '\*k_proj' .* is not supported; atomlite "
                                         r"runs fp8_e4m3 per_tensor static"):
        QuarkConfig.from_hf_config(quark_config(kv_cache_quant_config={"*k_proj": kv}))


def test_unsupported_global_scheme_is_fine_when_every_such_layer_is_overridden_or_excluded():
    fp8 = {**MXFP4_LAYER, "weight": {**MXFP4_TENSOR, "dtype": "fp8_e4m3", "qscheme": "per_group"}}
    config = QuarkConfig.from_hf_config(quark_config(global_quant_config=fp8, layer_quant_config={
        "*mlp.*": MXFP4_LAYER}))
    assert config.spec_for("model.layers.0.mlp.down_proj") == DYNAMIC
    with pytest.raises(ValueError, match=r"q_proj: quark scheme weight dtype=fp8_e4m3.*global_quant_config"):
        config.spec_for("model.layers.0.self_attn.q_proj")


def test_other_quant_methods_are_refused():
    with pytest.raises(ValueError, match="quant_method 'fp8'"):
        QuarkConfig.from_hf_config({"quantization_config": {"quant_method": "fp8"}})
