import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atomlite import LLM
from atomlite.config import EngineConfig, load_model_spec
from atomlite.plan import meta_model, plan_report
from atomlite.model_ops.platform import Platform
from helpers import atomlite_prompt_logprobs, hf_logprobs, random_prompt

REAL = Path(__file__).parents[2] / "examples" / "configs"


@pytest.mark.parametrize("variant", ["dense", "ple"])
def test_both_config_forms_describe_the_same_layers(checkpoints, variant):
    per_layer = load_model_spec(checkpoints.get(variant, per_layer_form=True)[0])
    hub = load_model_spec(checkpoints.get(variant, per_layer_form=False)[0])
    assert per_layer.layers == hub.layers
    assert {(l.kind, l.head_dim) for l in per_layer.layers} == {("sliding", 32), ("full", 64)}


def test_sharded_multimodal_checkpoint_never_reads_tower_tensors(checkpoints, tmp_path):
    """Text tensors go to one shard, towers to another that is unreadable garbage: loading must not touch it."""
    src, ref = checkpoints.get("dense", multimodal=True)
    out = shutil.copytree(src, tmp_path / "sharded")
    tensors = load_file(out / "model.safetensors")
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    save_file({n: tensors[n] for n in names[:half]}, out / "text-1.safetensors")
    save_file({n: tensors[n] for n in names[half:]}, out / "text-2.safetensors")
    (out / "towers.safetensors").write_bytes(b"not a safetensors file")
    weight_map = {n: "text-1.safetensors" if i < half else "text-2.safetensors" for i, n in enumerate(names)}
    weight_map["model.vision_tower.encoder.layers.0.weight"] = "towers.safetensors"
    weight_map["model.audio_tower.layers.0.weight"] = "towers.safetensors"
    weight_map["model.embed_vision.embedding_projection.weight"] = "towers.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    llm = LLM(str(out), dtype="float32", device="cpu")
    ids = random_prompt(20, seed=4)
    assert torch.allclose(atomlite_prompt_logprobs(llm, ids, 96), hf_logprobs(ref, ids)[:-1], atol=1e-4)


@pytest.mark.parametrize("name,params,sliding_kib,full_kib", [
    ("gemma-4-31B-it", 30.70e9, 800.0, 40.0), ("gemma-4-26B-A4B-it", 25.23e9, 200.0, 10.0)])  # full: V alone (k_eq_v)
def test_plan_on_real_dimensions_counts_params_and_kv_bytes(name, params, sliding_kib, full_kib):
    config = EngineConfig(model=str(REAL / name), max_model_len=32768)
    model = meta_model(config, Platform())
    text = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("vision."))
    assert abs(text - params) < 0.01e9  # the text model's (31B's config also declares its vision tower)
    lines, plan = plan_report(config, 100 * 2**30, Platform())
    by_kind = {g.spec.kind: g.bytes_per_token / 1024 for g in plan.groups}
    assert by_kind == {"sliding": sliding_kib, "full": full_kib}
    sliding = next(g for g in plan.groups if g.spec.kind == "sliding")
    assert plan.blocks_per_seq(sliding) == 1024 // 16 + 1
    assert plan.max_seqs_at_full_length >= 1 and "sequences of 32768 tokens fit" in lines[3]


def test_plan_shows_kv_sharing_on_e2b_dimensions():
    config = EngineConfig(model=str(REAL / "gemma-4-E2B-it"), max_model_len=8192)
    lines, plan = plan_report(config, 10 * 2**30, Platform())
    assert any("20 layers reuse" in line for line in lines)
    assert sum(len(g.layers) for g in plan.groups) == 15
