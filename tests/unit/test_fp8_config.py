"""FP8 quantization_config parsing: compressed-tensors (llm-compressor's FP8-Dynamic, FP8-block, FP8, weight-only)
and Quark (fp8, ptpc_fp8), what each module runs with, and the one-line refusals naming the config field."""
import copy
import json

import pytest

from atomlite.errors import ConfigError
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.quant.compressed_tensors import CompressedTensorsConfig
from atomlite.quant.fp8 import FP8Spec
from atomlite.quant.quark import QuarkConfig

EXAMPLES = "examples/configs"


def example(name: str) -> dict:
    with open(f"{EXAMPLES}/{name}/config.json") as f:
        return json.load(f)


def ct_config(**group_changes) -> dict:
    qc = copy.deepcopy(example("gemma-4-31B-it-fp8-dynamic")["quantization_config"])
    qc["config_groups"]["group_0"].update(group_changes)
    return {"quantization_config": qc}


def test_fp8_dynamic_is_channel_weights_and_dynamic_per_token_inputs_with_ignore_honoured():
    config = CompressedTensorsConfig.from_hf_config(example("gemma-4-31B-it-fp8-dynamic"))
    assert config.spec_for("model.layers.0.self_attn.qkv_proj") == FP8Spec("channel", "token",
                                                                           fmt="compressed-tensors")
    assert config.spec_for("model.layers.3.experts.7.down_proj").activation == "token"
    assert config.spec_for("lm_head") is None
    assert config.spec_for("model.layers.3.router.proj") is None


def test_fp8_block_is_128x128_weight_blocks_and_group_128_inputs():
    spec = CompressedTensorsConfig.from_hf_config(example("gemma-4-26B-A4B-it-fp8-block")).spec_for(
        "model.layers.0.mlp.down_proj")
    assert (spec.weight, spec.block, spec.activation, spec.group_size) == ("block", (128, 128), "group", 128)
    assert spec.scale_columns(704) == 6 and spec.scale_columns(2112) == 17  # partial last blocks


def test_weight_only_and_static_per_tensor_groups():
    assert CompressedTensorsConfig.from_hf_config(ct_config(input_activations=None)).spec_for(
        "model.layers.0.mlp.down_proj").activation is None
    static = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    spec = CompressedTensorsConfig.from_hf_config(ct_config(
        weights={**static}, input_activations={**static})).spec_for("model.layers.0.mlp.down_proj")
    assert (spec.weight, spec.activation) == ("tensor", "static")


def test_targets_and_ignore_accept_names_and_regexes():
    qc = ct_config(targets=["re:.*mlp\\..*_proj$"])
    qc["quantization_config"]["ignore"] = ["model.layers.1.mlp.down_proj", "re:.*layers\\.2\\..*"]
    config = CompressedTensorsConfig.from_hf_config(qc)
    assert config.spec_for("model.layers.0.self_attn.o_proj") is None  # not targeted
    assert config.spec_for("model.layers.0.mlp.down_proj") is not None
    assert config.spec_for("model.language_model.layers.0.mlp.down_proj") is not None
    assert config.spec_for("model.layers.1.mlp.down_proj") is None
    assert config.spec_for("model.layers.2.mlp.gate_up_proj") is None


@pytest.mark.parametrize("change, field", [
    (dict(weights={"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}), "group_0.weights"),
    (dict(weights={"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128}),
     "group_0.weights.strategy"),
    (dict(input_activations={"num_bits": 8, "type": "float", "strategy": "token", "dynamic": False}),
     "group_0.input_activations"),
    (dict(output_activations={"num_bits": 8, "type": "float", "strategy": "tensor"}), "group_0.output_activations"),
    (dict(format="pack-quantized"), "group_0.format"),
])
def test_an_unsupported_compressed_tensors_scheme_is_refused_at_load_naming_the_field(change, field):
    with pytest.raises(ConfigError, match=f"quantization_config.config_groups.{field}") as error:
        LinearBuilder(ct_config(**change))
    assert "\n" not in str(error.value)


def test_unsupported_top_level_fields_and_methods_are_refused():
    qc = ct_config()
    qc["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor"}
    with pytest.raises(ConfigError, match="quantization_config.kv_cache_scheme"):
        LinearBuilder(qc)
    qc = ct_config()
    qc["quantization_config"]["format"] = "nvfp4-pack-quantized"
    with pytest.raises(ConfigError, match="quantization_config.format 'nvfp4-pack-quantized'"):
        LinearBuilder(qc)
    with pytest.raises(ConfigError, match="quantization_config.quant_method 'fp8' is not supported"):
        LinearBuilder({"quantization_config": {"quant_method": "fp8"}})


def test_quark_fp8_is_per_tensor_static_and_ptpc_is_per_channel_dynamic_per_token():
    config = QuarkConfig.from_hf_config(example("gemma-4-31B-it-quark-fp8"))
    assert config.spec_for("model.layers.0.self_attn.qkv_proj") == FP8Spec("tensor", "static", fmt="quark")
    assert config.spec_for("model.layers.0.router.proj") is None
    qc = example("gemma-4-31B-it-quark-fp8")
    g = qc["quantization_config"]["global_quant_config"]
    g["weight"].update(qscheme="per_channel", ch_axis=0)
    g["input_tensors"].update(qscheme="per_channel", ch_axis=1, is_dynamic=True)
    assert QuarkConfig.from_hf_config(qc).spec_for("model.layers.0.mlp.down_proj") == FP8Spec("channel", "token",
                                                                                             fmt="quark")
    g["input_tensors"] = None
    assert QuarkConfig.from_hf_config(qc).spec_for("model.layers.0.mlp.down_proj").activation is None


@pytest.mark.parametrize("where, change, text", [
    ("weight", dict(qscheme="per_group", group_size=128), "weight dtype=fp8_e4m3 qscheme=per_group"),
    ("input_tensors", dict(is_dynamic=True), "input dtype=fp8_e4m3 qscheme=per_tensor"),
])
def test_an_unsupported_quark_fp8_scheme_is_refused_naming_it_and_the_layer(where, change, text):
    qc = example("gemma-4-31B-it-quark-fp8")
    qc["quantization_config"]["global_quant_config"][where].update(change)
    with pytest.raises(ConfigError, match="global_quant_config") as error:
        LinearBuilder(qc).linear("model.layers.0.mlp.down_proj", 64, 64)
    assert text in str(error.value) and "model.layers.0.mlp.down_proj" in str(error.value)


def test_fp8_under_tensor_parallelism_is_refused_for_now():
    from atomlite import distributed
    from atomlite.distributed import TensorParallel
    with distributed.use(TensorParallel(0, 2)):
        with pytest.raises(ConfigError, match="--tensor-parallel-size 1"):
            LinearBuilder(example("gemma-4-31B-it-fp8-dynamic")).linear("model.layers.0.mlp.down_proj", 64, 64)
