"""Runs real vLLM (CPU) on a tiny Gemma 4 vision checkpoint with one image prompt and prints its greedy tokens.

usage: python tests/e2e/vllm_image_cases.py MODEL_DIR '{"llm": {...}}'
"""
import json
import os
import sys

from vllm_cases import VLLM_ENV, atomlite_calls

PROMPT = "<start_of_turn>user\nWhat is in it?<|image|><end_of_turn>\n<start_of_turn>assistant\n"
MAX_TOKENS = 8
MM_KWARGS = {"max_soft_tokens": 70}


def image():
    import numpy as np
    from PIL import Image
    return Image.fromarray(np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8))


def run(model: str, llm_args: dict) -> dict:
    from vllm import LLM, SamplingParams
    llm = LLM(model=model, dtype="float32", max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True,
              seed=0, **llm_args)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image()}, "mm_processor_kwargs": MM_KWARGS},
                       params, use_tqdm=False)[0]
    return {"tokens": list(out.outputs[0].token_ids), "atomlite_calls": atomlite_calls()}


if __name__ == "__main__":
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)
    print("RESULT " + json.dumps(run(sys.argv[1], json.loads(sys.argv[2]))), flush=True)
