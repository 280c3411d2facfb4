"""What the demo model writes into its KV cache, against what e4m3 (--kv-cache-dtype fp8, unit scales) can hold.

    PYTHONPATH=. python bench/kv_ranges.py [--prompts 16]

Runs the bundled demo model (float32 KV) on the first --prompts questions of the gsm8k-style test set, then reads
every written cache entry of every layer: the largest magnitude (e4m3 saturates at 448; fnuz at 240) and the
share below e4m3's smallest normal (2^-6, where it keeps fewer than 3 mantissa bits).
"""
import argparse
import json
from pathlib import Path

import torch

from atomlite import LLM, SamplingParams
from atomlite.demo import demo_model_dir

DATA = Path(__file__).resolve().parents[1] / "ci" / "accuracy" / "data" / "gsm8k_test.jsonl"
SMALLEST_NORMAL = 2.0 ** -6


def written_entries(cache: torch.Tensor) -> torch.Tensor:
    """Rows of the cache that hold a token (never-written rows stay exactly zero)."""
    rows = cache.flatten(0, 1)
    return rows[rows.abs().amax(dim=(1, 2)) > 0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    questions = [json.loads(line)["question"] for line in DATA.read_text().splitlines()[:args.prompts]]
    llm = LLM(str(demo_model_dir()), dtype="float32", device="cpu", enable_prefix_caching=False)
    llm.generate([f"Question: {q}\nAnswer:" for q in questions], SamplingParams(temperature=0, max_tokens=64))
    kv = llm.engine.runner.kv
    for layer, (k_cache, v_cache) in sorted(kv.caches.items()):
        for name, cache in (("K", k_cache), ("V", v_cache)):
            if cache is None:
                continue
            values = written_entries(cache).abs()
            nonzero = values[values > 0]
            print(f"layer {layer} {name}: {values.shape[0]} tokens, max |x| {values.max():.3f}, "
                  f"below 2^-6 {(nonzero < SMALLEST_NORMAL).float().mean():.2%} of nonzero entries")


if __name__ == "__main__":
    main()
