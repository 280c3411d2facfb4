"""What the vLLM plugin tests share: vLLM runs in child processes (tests/e2e/vllm_cases.py; plugins load once per
process, so each ATOMLITE_VLLM_* setting gets its own), the prompts they answer, and a tiny random Llama."""
import json
import os
import subprocess
import sys
from pathlib import Path

import tiny_models
from helpers import random_prompt

CASES = Path(__file__).parent / "e2e" / "vllm_cases.py"
PROMPTS = [random_prompt(n, seed=n) for n in (5, 23, 40)]  # the Gemma 4 window is 8
MAX_TOKENS = 12


def run_vllm(runs: list[dict], timeout: int = 900, **env: str) -> dict:
    """vllm_cases.py over PROMPTS with each of runs' engine arguments; env: variables set for it (others named
    ATOMLITE_VLLM_* are dropped)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATOMLITE_VLLM_")} | env
    case = json.dumps({"prompts": PROMPTS, "max_tokens": MAX_TOKENS, "runs": runs})
    proc = subprocess.run([sys.executable, str(CASES), case], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM run failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def tiny_llama(out: Path):
    """(folder, float32 model) of a tiny random Llama that vLLM runs with its own model code."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    tiny_models.randomize(model, seed=3)
    model = model.float().eval()
    model.save_pretrained(out)
    return str(out), model
