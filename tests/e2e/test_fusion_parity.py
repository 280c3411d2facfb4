"""The link pass (model_ops.fusion) changes which kernels compute a layer's output, not the output: a model built
without it, every layer computing its own output (as vLLM's plugin builds it), scores and decodes like the linked
one."""
import pytest
import torch

from atomlite import LLM
from atomlite.engine import rank as engine_rank
from helpers import atomlite_prompt_logprobs, greedy, random_prompt

VOCAB = 96


def run(path, kernel_backend: str) -> tuple[LLM, torch.Tensor, list[list[int]]]:
    llm = LLM(str(path), dtype="float32", device="cpu", kernel_backend=kernel_backend, max_num_batched_tokens=16)
    logprobs = atomlite_prompt_logprobs(llm, random_prompt(8, seed=3), VOCAB)
    outputs = llm.generate([random_prompt(5, seed=5)], greedy(3))  # the prefill above, decode steps here
    return llm, logprobs, [out.outputs[0].token_ids for out in outputs]


# The MoE variant's layers hold the dense MLP too, so it covers the dense model's links as well.
@pytest.mark.parametrize("variant,kernel_backend", [("moe", "triton"), ("ple", "triton"), ("moe", "torch")])
def test_unlinked_model_scores_and_decodes_like_the_linked_one(checkpoints, monkeypatch, variant, kernel_backend):
    path, _ = checkpoints.get(variant)
    linked, linked_logprobs, linked_tokens = run(path, kernel_backend)
    monkeypatch.setattr(engine_rank, "link", lambda model: model)
    unlinked, logprobs, tokens = run(path, kernel_backend)
    first, unlinked_first = linked.engine.model.model.layers[0], unlinked.engine.model.model.layers[0]
    assert first.post_attention_layernorm.next_norms and not unlinked_first.post_attention_layernorm.next_norms
    torch.testing.assert_close(logprobs, linked_logprobs, rtol=0, atol=1e-5, equal_nan=True)
    assert tokens == linked_tokens
