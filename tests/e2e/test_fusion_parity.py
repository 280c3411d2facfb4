"""The link pass (model_ops.fusion) changes which kernels compute a layer's output, not the output: a model built
without it, every layer computing its own output (as vLLM's plugin builds it), scores and decodes like the linked
one; and linked, a norm that a residual update computes (Residual) never launches its own kernel."""
from collections import Counter

import pytest
import torch

from atomlite import LLM
from atomlite.engine.runner import rank as engine_rank
from atomlite.model_ops.norm import RMSNorm
from helpers import atomlite_prompt_logprobs, greedy, random_prompt

VOCAB = 96


def count_own_kernels(llm: LLM) -> Counter:
    """Counts, per norm's name, the launches of that norm's own kernel (RMSNorm.forward) from here on."""
    launches = Counter()
    for name, module in llm.engine.model.named_modules():
        if isinstance(module, RMSNorm):
            def counted(*args, _kernel=module._norm, _name=name):
                launches[_name] += 1
                return _kernel(*args)
            module._norm = counted
    return launches


def run(path, kernel_backend: str) -> tuple[LLM, torch.Tensor, list[list[int]], Counter]:
    llm = LLM(str(path), dtype="float32", device="cpu", kernel_backend=kernel_backend, max_num_batched_tokens=16)
    launches = count_own_kernels(llm)
    logprobs = atomlite_prompt_logprobs(llm, random_prompt(8, seed=3), VOCAB)
    outputs = llm.generate([random_prompt(5, seed=5)], greedy(3))  # the prefill above, decode steps here
    return llm, logprobs, [out.outputs[0].token_ids for out in outputs], launches


def computed_by_updates(llm: LLM) -> set[str]:
    """The names of the norms some residual update of the linked model computes (its next_norms)."""
    names = {id(module): name for name, module in llm.engine.model.named_modules()}
    return {names[id(norm)] for module in llm.engine.model.modules() if isinstance(module, RMSNorm)
            for norm in module.next_norms}


# The MoE variant's layers hold the dense MLP too, so it covers the dense model's links as well.
@pytest.mark.parametrize("variant,kernel_backend", [("moe", "triton"), ("ple", "triton"), ("moe", "torch")])
def test_unlinked_model_scores_and_decodes_like_the_linked_one(checkpoints, monkeypatch, variant, kernel_backend):
    path, _ = checkpoints.get(variant)
    linked, linked_logprobs, linked_tokens, linked_launches = run(path, kernel_backend)
    monkeypatch.setattr(engine_rank, "link", lambda model: model)
    unlinked, logprobs, tokens, launches = run(path, kernel_backend)
    first, unlinked_first = linked.engine.model.model.layers[0], unlinked.engine.model.model.layers[0]
    assert first.post_attention_layernorm.next_norms and not unlinked_first.post_attention_layernorm.next_norms
    torch.testing.assert_close(logprobs, linked_logprobs, rtol=0, atol=1e-5, equal_nan=True)
    assert tokens == linked_tokens
    handed = computed_by_updates(linked)
    assert "model.layers.0.pre_feedforward_layernorm" in handed
    assert all(launches[name] > 0 for name in handed)  # unlinked, each runs its own kernel every forward
    assert not handed & set(linked_launches)  # linked, never: its update computed it
    assert sum(linked_launches.values()) < sum(launches.values())
