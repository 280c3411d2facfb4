"""The accuracy gate itself: catalog, metric lookup, a gate that fails on a broken model (its text model, or its
vision tower for demo-vqa), and per-sample parity between atomlite's server and transformers (lm-eval's `hf` model)
on the demo model."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from atomlite.accuracy.catalog import REPO_CI, load_catalog, select
from atomlite.accuracy.runner import judge, lm_eval_run, read_metric, render_task, run_job
from atomlite.demo import demo_model_dir
from atomlite.errors import ConfigError

pytest.importorskip("lm_eval")
PARITY_LIMIT = 60


def test_catalog_pr_jobs_gate_a_few_points_under_their_baseline():
    jobs = select(load_catalog(REPO_CI / "catalog.yaml"), (), True, "pr")
    assert {j.name for j in jobs} == {"demo-gsm8k", "demo-gsm8k-fp8-kv", "demo-mmlu", "demo-vqa"}
    for job in jobs:
        assert job.baseline is not None and job.threshold is not None, job.name
        assert job.baseline - 0.06 <= job.threshold < job.baseline, job.name


def test_catalog_that_is_not_a_mapping_of_jobs_is_a_clear_error(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("- name: x\n")
    with pytest.raises(ConfigError, match="a mapping with a list under 'jobs:'"):
        load_catalog(path)


def test_missing_metric_is_a_failure_not_a_pass():
    job = load_catalog(REPO_CI / "catalog.yaml")[0]
    with pytest.raises(KeyError, match="missing"):
        read_metric({"results": {job.task: {"exact_match,flexible-extract": 1.0}}}, job)
    assert judge(0.5, job)[0] == "fail" and judge(1.0, job)[0] == "pass"


def _correct(samples: list[dict], metric: str, filter_name: str) -> dict[int, float]:
    return {s["doc_id"]: s[metric] for s in samples if s.get("filter", filter_name) == filter_name}


@pytest.mark.parametrize("job_name,metric,filter_name", [("demo-gsm8k", "exact_match", "strict-match"),
                                                         ("demo-mmlu", "acc", "none")])
def test_server_scores_each_sample_like_transformers(tmp_path, job_name, metric, filter_name):
    job = next(j for j in load_catalog(REPO_CI / "catalog.yaml") if j.name == job_name)
    result = run_job(job, REPO_CI, tmp_path, limit=PARITY_LIMIT)
    assert result.status in ("pass", "fail"), result.detail
    served = [json.loads(line) for line in open(tmp_path / f"{job.name}.samples.jsonl")]
    include = render_task(job, REPO_CI, tmp_path / "tasks")
    reference = lm_eval_run("hf", {"pretrained": str(demo_model_dir()), "dtype": "float32", "device": "cpu",
                                   "batch_size": 16}, job, include, PARITY_LIMIT)
    ours, theirs = _correct(served, metric, filter_name), _correct(reference["samples"][job.task], metric,
                                                                   filter_name)
    assert len(ours) == len(theirs) == PARITY_LIMIT
    differing = [d for d in ours if ours[d] != theirs[d]]
    assert len(differing) <= 1, differing


@pytest.mark.parametrize("job_name", ["demo-gsm8k", "demo-mmlu"])
def test_gate_fails_on_a_perturbed_checkpoint(tmp_path, job_name):
    broken = shutil.copytree(demo_model_dir(), tmp_path / "broken")
    tensors = load_file(broken / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    # The first layer's MLP with noise of 5x its weights' spread: the trained model shrugs off 2x, or any noise on a
    # later layer's MLP, on the MMLU-style task (held-out probes: layer 0 at 5x scores 0.0 gsm8k, 0.69 MMLU)
    for name in [n for n in tensors if n.startswith("model.language_model.layers.0.mlp.")]:
        weight = tensors[name].float()
        noise = torch.randn(weight.shape, generator=g) * weight.std() * 5
        tensors[name] = (weight + noise).to(tensors[name].dtype)
    save_file(tensors, broken / "model.safetensors")
    run = subprocess.run([sys.executable, "-m", "atomlite.cli", "eval", job_name, "--model", str(broken),
                          "--limit", "40", "--report-dir", str(tmp_path / "report")], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "report" / "results.json").read_text())[0]
    assert result["status"] == "fail" and result["score"] < result["threshold"]


def test_plain_lm_eval_runs_the_written_tasks_against_the_demo_server(tmp_path):
    """`atomlite eval --write-tasks DIR` makes the catalog's tasks usable by lm-eval's own command line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from atomlite import LLM
    from atomlite.demo import demo_model_dir
    from atomlite.server.app import make_app
    from server_utils import running

    tasks = tmp_path / "tasks"
    subprocess.run([sys.executable, "-m", "atomlite.cli", "eval", "--write-tasks", str(tasks)], check=True,
                   capture_output=True)
    engine = LLM(str(demo_model_dir()), device="cpu", max_model_len=2048).engine
    lm_eval = Path(sys.executable).parent / "lm_eval"
    with running(make_app(engine, "atomlite-demo")) as base:
        run = subprocess.run(
            [str(lm_eval), "--model", "local-completions", "--model_args",
             f"base_url={base}/v1/completions,model=atomlite-demo,tokenizer_backend=remote",
             "--include_path", str(tasks), "--tasks", "demo_gsm8k", "--limit", "5"],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "demo_gsm8k" in run.stdout and "exact_match" in run.stdout, run.stdout[-2000:]


def _with_shuffled_vision_encoder(folder):
    """The demo with each weight of its vision encoder's layers shuffled: their values kept, their places lost."""
    tensors = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    for name in [n for n in tensors if n.startswith("model.vision_tower.encoder.")]:
        flat = tensors[name].flatten()
        tensors[name] = flat[torch.randperm(flat.numel(), generator=g)].view(tensors[name].shape)
    save_file(tensors, folder / "model.safetensors")
    return folder


def test_demo_vqa_passes_on_the_demo_and_fails_on_a_perturbed_vision_tower(tmp_path):
    job = next(j for j in load_catalog(REPO_CI / "catalog.yaml") if j.name == "demo-vqa")
    trained = run_job(job, REPO_CI, tmp_path / "trained", limit=job.limit)
    assert trained.status == "pass", trained.detail
    broken = _with_shuffled_vision_encoder(shutil.copytree(demo_model_dir(), tmp_path / "broken"))
    perturbed = run_job(job, REPO_CI, tmp_path / "perturbed", model=broken, limit=job.limit)
    assert perturbed.status == "fail" and perturbed.score < job.threshold, perturbed.detail
    samples = [json.loads(line) for line in open(tmp_path / "trained" / "demo-vqa.samples.jsonl")]
    assert len(samples) == job.limit and {s["question"] for s in samples} > {"What color are the shapes?"}
