"""Adapters the engine must refuse, each with one line naming the problem (offline a ValueError, as vLLM's): a rank
above max_lora_rank, a module the model does not have, an adapter for another base model (shapes), a missing
file, MoE experts' target_parameters, DoRA; and LoRA requested from an engine started without it."""
import json

import pytest
import torch
from safetensors.torch import save_file

from atomlite import LLM, SamplingParams
from atomlite.errors import ConfigError
from atomlite.lora import LoRARequest

HIDDEN, Q_ROWS = 64, 4 * 32  # the tiny dense model: hidden 64, 4 heads of 32 on its sliding layers
KEY = "base_model.model.model.layers.0.self_attn.{}.lora_{}.weight"


def write_adapter(folder, tensors: dict, **config):
    folder.mkdir(parents=True, exist_ok=True)
    fields = dict(peft_type="LORA", r=4, lora_alpha=8, target_modules=["q_proj"], bias="none")
    (folder / "adapter_config.json").write_text(json.dumps({**fields, **config}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "adapter_model.safetensors")
    return str(folder)


def q_adapter(rank=4, in_features=HIDDEN, out_features=Q_ROWS, module="q_proj"):
    return {KEY.format(module, "A"): torch.randn(rank, in_features), KEY.format(module, "B"): torch.randn(out_features,
                                                                                                        rank)}


@pytest.fixture(scope="module")
def llm(checkpoints):
    return LLM(str(checkpoints.get("dense")[0]), dtype="float32", device="cpu", enable_lora=True, max_lora_rank=8)


def refusal(llm, request: LoRARequest) -> str:
    with pytest.raises(ValueError) as e:
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), lora_request=request)
    message = str(e.value)
    assert "\n" not in message and not llm.engine.has_unfinished()
    return message


def test_a_good_adapter_runs(llm, tmp_path):
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2),
                       lora_request=LoRARequest("ok", 1, write_adapter(tmp_path / "ok", q_adapter())))
    assert len(out[0].outputs[0].token_ids) == 2


def test_rank_above_max_lora_rank_is_vllms_error(llm, tmp_path):
    path = write_adapter(tmp_path / "wide", q_adapter(rank=16), r=16)
    assert refusal(llm, LoRARequest("wide", 2, path)) == "LoRA rank 16 is greater than max_lora_rank 8."


def test_a_module_the_model_lacks_is_named(llm, tmp_path):
    tensors = {k.replace("layers.0.", "layers.9."): v for k, v in q_adapter().items()}
    message = refusal(llm, LoRARequest("deep", 3, write_adapter(tmp_path / "deep", tensors)))
    assert "model.layers.9.self_attn.q_proj" in message and "not a projection this model adapts" in message


def test_v_proj_on_a_layer_whose_v_is_k_is_refused(llm, tmp_path):
    """Full-attention k_eq_v layers have no v_proj (transformers has none either): its adapter cannot apply."""
    full_layer = 5  # the tiny model's layer_types put a full-attention layer last
    tensors = {k.replace("layers.0.", f"layers.{full_layer}."): v for k, v in
               q_adapter(out_features=64, module="v_proj").items()}
    message = refusal(llm, LoRARequest("v", 4, write_adapter(tmp_path / "v", tensors)))
    assert f"model.layers.{full_layer}.self_attn.v_proj" in message


def test_an_adapter_for_another_base_model_is_found_by_shape(llm, tmp_path):
    message = refusal(llm, LoRARequest("other", 5, write_adapter(tmp_path / "other", q_adapter(in_features=80))))
    assert "(4, 80)" in message and f"(4, {HIDDEN})" in message and "another base model" in message


@pytest.mark.parametrize("missing", ["folder", "adapter_model.safetensors", "adapter_config.json"])
def test_a_missing_file_is_named(llm, tmp_path, missing):
    path = write_adapter(tmp_path / "gone", q_adapter())
    if missing == "folder":
        path = str(tmp_path / "nowhere")
    else:
        (tmp_path / "gone" / missing).unlink()
    message = refusal(llm, LoRARequest("gone", 6, path))
    assert (missing if missing != "folder" else "nowhere") in message


@pytest.mark.parametrize("config,named", [
    (dict(target_parameters=["experts.gate_up_proj"]), "target_parameters"),
    (dict(use_dora=True), "DoRA"),
    (dict(bias="all"), "bias"),
])
def test_what_atomlite_does_not_compute_is_refused_not_ignored(llm, tmp_path, config, named):
    message = refusal(llm, LoRARequest("odd", 7, write_adapter(tmp_path / "odd", q_adapter(), **config)))
    assert named in message


def test_an_embedding_adapter_is_refused(llm, tmp_path):
    tensors = {**q_adapter(), "base_model.model.model.embed_tokens.lora_embedding_A": torch.randn(4, 96)}
    message = refusal(llm, LoRARequest("embed", 8, write_adapter(tmp_path / "embed", tensors)))
    assert "lora_embedding_A" in message


def test_lora_request_without_enable_lora(checkpoints, tmp_path):
    plain = LLM(str(checkpoints.get("dense")[0]), dtype="float32", device="cpu")
    message = refusal(plain, LoRARequest("x", 1, write_adapter(tmp_path / "x", q_adapter())))
    assert "enable_lora" in message


def test_settings_are_checked(checkpoints):
    with pytest.raises(ConfigError, match="max-cpu-loras"):
        LLM(str(checkpoints.get("dense")[0]), device="cpu", enable_lora=True, max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("x", 0, "/tmp")
