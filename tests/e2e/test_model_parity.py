"""atomlite's Gemma 4 against transformers' own, float32, on tiny random models with randomized norms."""
import pytest
import torch

from atomlite import LLM
from helpers import DEVICES, atomlite_prompt_logprobs, greedy, hf_greedy, hf_logprobs, random_prompt

VOCAB = 96
CASES = [
    ("dense", False, True), ("dense", False, False), ("moe", False, True), ("moe", False, False),
    ("ple", False, True), ("ple", False, False), ("dense", True, True), ("ple", True, False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant,multimodal,per_layer_form", CASES)
def test_prompt_logprobs_match_transformers(checkpoints, variant, multimodal, per_layer_form, device):
    path, ref = checkpoints.get(variant, multimodal=multimodal, per_layer_form=per_layer_form)
    llm = LLM(str(path), dtype="float32", device=device)
    ids = random_prompt(40, seed=1)  # longer than the sliding window (8)
    mine = atomlite_prompt_logprobs(llm, ids, VOCAB)
    expected = hf_logprobs(ref, ids)[:-1]
    assert torch.allclose(mine, expected, atol=1e-4, rtol=0), (mine - expected).abs().max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["dense", "moe", "ple"])
def test_greedy_tokens_match_transformers_generate(checkpoints, variant, device):
    path, ref = checkpoints.get(variant)
    llm = LLM(str(path), dtype="float32", device=device)
    prompts = [random_prompt(n, seed=n) for n in (1, 5, 8, 9, 23)]
    outputs = llm.generate(prompts, greedy(12))
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 12), len(prompt)
