"""Models declare what is theirs through atomlite.registry: config.py, the engine and the benchmarks name no model
family, the registry imports a model only when a config of its architecture is read, and a family's config parsing
says which field it refuses (Gemma 3's, read as transformers reads it)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atomlite import registry
from atomlite.config import load_model_spec
from atomlite.errors import ConfigError
from atomlite.models.gemma3 import parse_config

ROOT = Path(__file__).parents[2] / "atomlite"
MODEL_AGNOSTIC = [ROOT / "config.py", *sorted((ROOT / "engine").rglob("*.py")),
                  *sorted((ROOT / "benchmarks").rglob("*.py"))]
FAMILY_MODULES = {entry.split(":")[0] for entry in registry.MODELS.values()}


def test_config_engine_and_benchmarks_name_no_model_family():
    named = [f"{path.relative_to(ROOT)}:{i}" for path in MODEL_AGNOSTIC
             for i, line in enumerate(path.read_text().splitlines(), 1) if re.search("gemma", line, re.I)]
    assert named == []
    imports = [f"{path.relative_to(ROOT)}: {module}" for path in MODEL_AGNOSTIC for module in FAMILY_MODULES
               if re.search(rf"\b{re.escape(module)}\b", path.read_text())]
    assert imports == []


def test_reading_config_imports_no_model_until_a_checkpoint_is_read(tmp_path):
    code = ("import sys, atomlite.config, atomlite.engine.runner.rank; "
            "print(sorted(m for m in sys.modules if m.startswith('atomlite.models.gemma')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def gemma3(**fields) -> dict:
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": 7, **fields}


def test_gemma3_layers_follow_sliding_window_pattern_and_legacy_rope_fields():
    layout = parse_config(gemma3(sliding_window_pattern=3, rope_theta=5e5, rope_local_base_freq=2e3,
                                 rope_scaling={"type": "linear", "factor": 8.0}))
    assert [layer.kind for layer in layout.layers] == ["sliding", "sliding", "full"] * 2 + ["sliding"]
    assert layout.rope == {"sliding": {"rope_type": "default", "rope_theta": 2e3},
                           "full": {"type": "linear", "factor": 8.0, "rope_type": "linear", "rope_theta": 5e5}}
    assert layout.hf["head_dim"] == 256 and layout.hf["query_pre_attn_scalar"] == 256  # transformers' defaults


@pytest.mark.parametrize("fields,named", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "full_attention RoPE"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(hidden_activation="silu"), "hidden_activation"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings"),
    (dict(layer_types=["sliding_attention"] * 6), "layer_types"),
    (dict(sliding_window=None), "sliding_window"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0}), "per layer type"),
])
def test_gemma3_configs_it_cannot_run_are_refused_by_field(fields, named):
    with pytest.raises(ConfigError, match=named):
        parse_config(gemma3(**fields))


def test_mtp_on_a_model_without_an_assistant_says_to_use_ngram(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(gemma3()))
    spec = load_model_spec(tmp_path)
    assert spec.architecture == "Gemma3ForCausalLM"
    with pytest.raises(ConfigError, match="ngram"):
        registry.mtp_assistant(spec.architecture)


def test_a_multimodal_gemma3_config_takes_its_special_tokens_from_the_top_level():
    layout = parse_config({"architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106],
                           "text_config": {"num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2}})
    assert layout.multimodal and layout.vision is None
    assert layout.hf["eos_token_id"] == [1, 106] and layout.hf["bos_token_id"] == 2
