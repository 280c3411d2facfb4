"""FP8 example configs with `--load-format dummy`: e4m3 weights at real shapes (tiny here), finite outputs, the
plan's bytes, and the startup line that says which semantics run."""
import json

import pytest
import torch

from atomlite import LLM
from helpers import greedy, random_prompt

EXAMPLES = "examples/configs"


def _with_quantization(checkpoints, tmp_path, variant: str, example: str):
    path, _ = checkpoints.get(variant)
    raw = json.loads((path / "config.json").read_text())
    with open(f"{EXAMPLES}/{example}/config.json") as f:
        raw["quantization_config"] = json.load(f)["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


@pytest.mark.parametrize("variant, example", [
    ("dense", "gemma-4-31B-it-fp8-dynamic"), ("dense", "gemma-4-31B-it-quark-fp8"),
    ("moe", "gemma-4-26B-A4B-it-fp8-block"), ("moe", "gemma-4-26B-A4B-it-quark-fp8"),
])
def test_dummy_fp8_weights_have_real_shapes_and_finite_outputs(checkpoints, tmp_path, variant, example):
    from atomlite.model_ops.fp8_moe import FP8Experts
    llm = LLM(str(_with_quantization(checkpoints, tmp_path, variant, example)), load_format="dummy",
              dtype="float32", device="cpu")
    proj = llm.engine.model.model.layers[0].mlp.down_proj
    assert proj.weight.dtype == torch.float8_e4m3fn and proj.weight.shape == (64, 96)
    assert proj.weight.float().std().item() * proj.weight_scale.mean().item() == pytest.approx(0.02, rel=0.2)
    experts = [m for m in llm.engine.model.modules() if isinstance(m, FP8Experts)]
    assert len(experts) == (len(llm.engine.model.model.layers) if variant == "moe" else 0)
    assert any(line.startswith("fp8 checkpoint: ") for line in llm.engine.describe())
    tokens = llm.generate([random_prompt(7, seed=3)], greedy(4))[0].outputs[0].token_ids
    assert len(tokens) == 4


def test_plan_shows_fp8_weights_at_a_byte_each():
    from atomlite.config import EngineConfig
    from atomlite.model_ops.platform import Platform
    from atomlite.plan import meta_model, weight_bytes
    sizes = {}
    for name in ("gemma-4-31B-it", "gemma-4-31B-it-fp8-dynamic", "gemma-4-31B-it-fp8-block"):
        model = meta_model(EngineConfig(model=f"{EXAMPLES}/{name}", device="cpu"), Platform())
        sizes[name] = weight_bytes(model) / 2 ** 30
    bf16, dynamic, block = sizes.values()
    # the projections go from 2 bytes to 1; embeddings and norms stay bf16; block scales add 4 bytes per 128
    assert 0.5 * bf16 < dynamic < 0.55 * bf16
    assert dynamic < block < dynamic * 1.02
