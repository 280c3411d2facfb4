"""--model as a Hugging Face hub repo id, read from a hub cache each test fills itself, with the network off:
HF_HUB_OFFLINE=1 and the hub endpoint pointed at a closed local port."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load_file, save_file

from atomlite import LLM, SamplingParams
from atomlite.config import EngineConfig, load_model_spec
from atomlite.errors import ConfigError
from helpers import atomlite_prompt_logprobs, hf_logprobs, random_prompt

REPO = "atomlite-test/tiny-gemma"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CLOSED_ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


def fill_cache(cache: Path, repo_id: str, source: Path, skip: tuple[str, ...] = ()) -> Path:
    """Lay source's files out as huggingface_hub caches a repo: blobs, snapshots/<commit>/<file> linking to
    them, refs/main naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot, blobs = repo / "snapshots" / COMMIT, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in sorted(source.iterdir()):
        if file.is_file() and file.name not in skip:
            blob = blobs / f"{len(list(blobs.iterdir())):040x}"
            shutil.copy(file, blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache, offline, for this process (huggingface_hub read the environment at import)."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def cli(tmp_path: Path, *args: str, offline: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_ENDPOINT": CLOSED_ENDPOINT, "HF_HUB_OFFLINE": "1" if offline else "0"}
    return subprocess.run([sys.executable, "-m", "atomlite.cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_hub_id_generates_what_its_folder_generates_from_the_cache_with_the_network_off(random_model_dir, tmp_path):
    fill_cache(tmp_path / "hf" / "hub", REPO, random_model_dir)
    args = ["--dtype", "float32", "--max-tokens", "8", "Hello there"]
    from_hub, from_folder = cli(tmp_path, "generate", "--model", REPO, *args), \
        cli(tmp_path, "generate", "--model", str(random_model_dir), *args)
    assert from_hub.returncode == 0, from_hub.stderr
    assert from_hub.stdout == from_folder.stdout and "8 tokens" in from_hub.stdout


def test_hub_id_reads_only_the_shards_of_text_tensors(checkpoints, tmp_path, offline_cache):
    """A multimodal checkpoint whose index puts tower tensors in a shard of their own, cached without it."""
    src, ref = checkpoints.get("dense", multimodal=True)
    folder = shutil.copytree(src, tmp_path / "sharded")
    text, towers = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (folder / "model.safetensors").rename(folder / text)
    tower_tensors = {"model.vision_tower.encoder.layers.0.weight": torch.zeros(4, 4),
                     "model.audio_tower.layers.0.weight": torch.zeros(4, 4)}
    save_file(tower_tensors, folder / towers)
    weight_map = {**{n: text for n in load_file(folder / text)}, **{n: towers for n in tower_tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    fill_cache(offline_cache, REPO, folder, skip=(towers,))
    llm = LLM(REPO, dtype="float32", device="cpu")
    ids = random_prompt(20, seed=5)
    assert torch.allclose(atomlite_prompt_logprobs(llm, ids, 96), hf_logprobs(ref, ids)[:-1], atol=1e-4)


def test_plan_reads_a_hub_id_whose_weights_are_not_cached(random_model_dir, tmp_path, offline_cache):
    fill_cache(offline_cache, REPO, random_model_dir, skip=("model.safetensors",))
    config = EngineConfig(model=REPO, max_model_len=64)
    assert config.model_spec.repo_id == REPO and config.model_spec.path.parent.parent.name == "models--" + \
        REPO.replace("/", "--")
    with pytest.raises(ConfigError, match=f"--model {REPO}: no such folder, and the Hugging Face cache .* lacks the "
                                          f"repo's \\*.safetensors weights, which HF_HUB_OFFLINE=1 forbids"):
        LLM(REPO, device="cpu")


def test_uncached_hub_id_offline_is_one_line(tmp_path, offline_cache):
    with pytest.raises(ConfigError, match="--model atomlite-test/not-cached: no such folder, and the Hugging Face "
                                          "cache .* lacks the repo's config.json, which HF_HUB_OFFLINE=1 forbids"):
        LLM("atomlite-test/not-cached", device="cpu")
    result = cli(tmp_path, "plan", "--model", "atomlite-test/not-cached")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: --model atomlite-test/not-cached: no such folder"), result.stderr


def test_unreachable_hub_is_one_line(tmp_path):
    result = cli(tmp_path, "plan", "--model", "atomlite-test/not-cached", offline=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: --model atomlite-test/not-cached: no such folder, and the hub repo could "
                                    "not be downloaded"), result.stderr


def test_local_folder_wins_over_a_hub_id(random_model_dir, tmp_path, offline_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(random_model_dir, tmp_path / REPO)
    spec = load_model_spec(REPO)
    assert spec.repo_id is None and spec.path == Path(REPO)
    assert LLM(REPO, dtype="float32", device="cpu").generate("Hi", SamplingParams(max_tokens=2))[0].outputs[0].text


def test_served_name_of_a_hub_id_is_the_id(tmp_path):
    from atomlite.commands.serve import default_served_name
    assert default_served_name(REPO, REPO) == REPO
    assert default_served_name(str(tmp_path / "ckpt"), str(tmp_path / "ckpt")) == "ckpt"
    assert default_served_name(None, str(tmp_path)) == "atomlite-demo"
