"""Bad input gets a message that names the problem, never a traceback from deep inside."""
import json
import random
import re
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from atomlite import LLM, SamplingParams
from atomlite.demo import demo_model_dir
from atomlite.errors import ConfigError
from helpers import random_prompt


@pytest.fixture(scope="module")
def llm(checkpoints):
    path, _ = checkpoints.get("dense")
    return LLM(str(path), dtype="float32", device="cpu", max_model_len=64)


@pytest.mark.parametrize("prompt,message", [
    ([], "empty"),
    (random_prompt(64, seed=0), "context length"),
    ([5, 10_000], "token ids"),
    ("text", "no tokenizer"),
])
def test_bad_prompts_are_rejected_and_leave_nothing_behind(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt], SamplingParams())
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=-3), "max_tokens"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(temperature=-1), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(logprobs=-1), "logprobs"), (dict(stop=[""]), "stop"),
])
def test_bad_sampling_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture_lists_supported(checkpoints, tmp_path):
    path = _copy(checkpoints.get("dense")[0], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="LlamaForCausalLM.*supported: Gemma4ForCausalLM"):
        LLM(str(path), device="cpu")


def test_missing_weight_file_is_named(checkpoints, tmp_path):
    path = _copy(checkpoints.get("dense")[0], tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no \\*.safetensors weights"):
        LLM(str(path), device="cpu")


def _truncate(file):
    data = file.read_bytes()
    file.write_bytes(data[:len(data) // 3])


def _random_bytes(file):
    file.write_bytes(random.Random(0).randbytes(file.stat().st_size))


def _sharded(path):
    """The checkpoint split in two shards under an index: a damaged shard is found while loading, not indexing."""
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, path / file)
    weight_map = {n: file for file, part in shards.items() for n in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return path / "model-00002-of-00002.safetensors"


@pytest.mark.parametrize("damage", [_truncate, _random_bytes])
@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_damaged_weight_file_is_one_error_naming_it(checkpoints, tmp_path, damage, layout):
    path = _copy(checkpoints.get("dense")[0], tmp_path / "m")
    file = _sharded(path) if layout == "sharded" else path / "model.safetensors"
    damage(file)
    with pytest.raises(ConfigError, match=f"weight file {re.escape(str(file))} is not a readable safetensors file"):
        LLM(str(path), device="cpu")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # generate reads text prompts: it checks that first
        shutil.copy(demo_model_dir() / name, path / name)
    result = subprocess.run([sys.executable, "-m", "atomlite.cli", "generate", "--model", str(path), "hi"],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: weight file {file}") and result.stderr.count("\n") == 1, result.stderr


def test_generate_without_a_tokenizer_says_so_before_reading_weights(checkpoints, tmp_path):
    path = tmp_path / "config-only"
    path.mkdir()
    shutil.copy(checkpoints.get("dense")[0] / "config.json", path / "config.json")  # no weights: loading would fail
    result = subprocess.run([sys.executable, "-m", "atomlite.cli", "generate", "--model", str(path), "hi"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {path} has no tokenizer"), result.stderr


def test_unreadable_index_is_named(checkpoints, tmp_path):
    path = _copy(checkpoints.get("dense")[0], tmp_path / "m")
    _sharded(path)
    (path / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(ConfigError, match="model.safetensors.index.json is not a safetensors index"):
        LLM(str(path), device="cpu")


def _rewrite(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors")


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.pop("model.layers.2.mlp.up_proj.weight"), "lacks 1 tensor.*layers.2.mlp.gate_up_proj"),
    (lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight", t["model.layers.0.self_attn.q_proj.weight"][:5]),
     "model.layers.0.self_attn.q_proj.weight in .*model.safetensors has shape \\(5, 64\\), expected \\(128, 64\\)"),
    (lambda t: t.__setitem__("model.layers.0.self_attn.extra.weight", t["model.norm.weight"].clone()),
     "unexpected tensor model.layers.0.self_attn.extra.weight"),
])
def test_bad_tensors_are_named_with_their_file(checkpoints, tmp_path, edit, message):
    path = _copy(checkpoints.get("dense")[0], tmp_path / "m")
    _rewrite(path, edit)
    with pytest.raises(ConfigError, match=message):
        LLM(str(path), device="cpu")


def test_per_expert_tensors_for_float_experts_are_refused(checkpoints, tmp_path):
    """Per-expert tensors (Quark's export layout) where the config leaves the experts unquantized."""
    path = _copy(checkpoints.get("moe")[0], tmp_path / "m")

    def split_experts(tensors):
        name = next(n for n in tensors if n.endswith("experts.gate_up_proj"))
        fused = tensors.pop(name)
        for e in range(fused.shape[0]):
            gate, up = fused[e].chunk(2)
            tensors[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate.contiguous()
            tensors[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = up.contiguous()
    _rewrite(path, split_experts)
    message = r"experts\.0\.(gate|up)_proj\.weight .* is one part of .*experts\.gate_up_proj"
    with pytest.raises(ConfigError, match=message):
        LLM(str(path), device="cpu")


def test_cli_reports_errors_without_traceback(checkpoints, tmp_path):
    cases = [
        ["generate", "--model", str(tmp_path / "nowhere"), "hi"],
        ["generate", "--model", str(checkpoints.get("dense")[0]), "--max-tokens", "0", "hi"],
        ["plan", "--model", str(checkpoints.get("dense")[0]), "--kv-cache-memory", "lots"],
    ]
    for args in cases:
        result = subprocess.run([sys.executable, "-m", "atomlite.cli", *args], capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr, result.stderr
