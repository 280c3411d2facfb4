"""GPU check of the batched sampler through the engine: seeded requests repeat and do not depend on the batch,
top-k 1 equals greedy, and a temperature/top-p batch finishes (random tiny Gemma 4, float32).

    PYTHONPATH=. python bench/sampling_check.py
"""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tiny_models  # noqa: E402

from atomlite import LLM, SamplingParams  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as out:
        tiny_models.build("dense", Path(out))
        llm = LLM(out, dtype="float32", device="cuda")
        prompt = list(range(3, 20))
        seeded = SamplingParams(temperature=0.9, top_p=0.9, top_k=20, seed=5, max_tokens=12, ignore_eos=True)
        alone = llm.generate([prompt], seeded)[0].outputs[0].token_ids
        others = [SamplingParams(temperature=1.3, max_tokens=12, ignore_eos=True)] * 4
        batched = llm.generate([prompt] + [list(range(5, 12))] * 4, [seeded] + others)[0].outputs[0].token_ids
        greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        top1 = llm.generate([prompt], SamplingParams(temperature=1.0, top_k=1, max_tokens=12, ignore_eos=True))
        checks = {"seeded request repeats alone and in a batch": alone == batched,
                  "top_k 1 equals greedy": top1[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids}
        print(f"device: {torch.cuda.get_device_name()}; graphs: {llm.engine.graph_note}")
        for name, ok in checks.items():
            print(f"{'ok  ' if ok else 'FAIL'} {name}")
        sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
