"""LoRA adapters against PEFT's own model, float32, on tiny random dense and MoE Gemma 4 checkpoints: two adapters of
different rank and alpha (one rsLoRA, one on fewer projections) and base rows in one batch give PEFT's greedy tokens
and its logprobs within 1e-3; also from the decode graphs' static buffers, through slot eviction (one slot, three
adapters' worth of requests), over two tensor-parallel ranks, with n-gram speculative decoding, and on the Triton
kernels. The prefix cache never shares a block between adapters, or between an adapter and the base model."""
import pytest
import torch

from atomlite import LLM, SamplingParams
from atomlite.lora import LoRARequest
from helpers import greedy, hf_greedy, hf_logprobs, random_prompt
from lora_adapters import build_adapters
import tiny_models

VOCAB = 96
PROMPTS = [random_prompt(n, seed=40 + n) for n in (19, 9, 23, 14, 11)]
ADAPTER_OF = ["first", "second", None, "first", "second"]  # per prompt: two adapters and the base model in one batch


@pytest.fixture(scope="module", params=["dense", "moe"])
def served(request, tmp_path_factory):
    """(checkpoint folder, {name: LoRARequest}, the PEFT model holding both adapters)."""
    out = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = tiny_models.build(request.param, out / "model", seed=3)
    peft_model = build_adapters(base, out, seed=11)
    loras = {name: LoRARequest(name, i + 1, str(out / name)) for i, name in enumerate(("first", "second"))}
    return out / "model", loras, peft_model


def reference(peft_model, adapter: str | None, run):
    if adapter is None:
        with peft_model.disable_adapter():
            return run(peft_model)
    peft_model.set_adapter(adapter)
    return run(peft_model)


def lora_llm(path, **args) -> LLM:
    return LLM(str(path), dtype="float32", device="cpu", enable_lora=True, max_loras=2, max_lora_rank=8, **args)


def requests_of(loras: dict, names: list) -> list:
    return [None if name is None else loras[name] for name in names]


@pytest.mark.parametrize("from_graph_buffers", [False, True])
def test_mixed_batch_greedy_tokens_match_peft(served, from_graph_buffers):
    path, loras, peft_model = served
    llm = lora_llm(path)
    if from_graph_buffers:  # decode steps read the row slots from the graphs' static buffers
        llm.engine.runner.use_decode_graphs(8, llm.engine.config.max_model_len, capture=False)
    outputs = llm.generate(PROMPTS, greedy(10), lora_request=requests_of(loras, ADAPTER_OF))
    for prompt, name, out in zip(PROMPTS, ADAPTER_OF, outputs):
        want = reference(peft_model, name, lambda m: hf_greedy(m, prompt, 10))
        assert out.outputs[0].token_ids == want, name
    if from_graph_buffers:
        assert llm.engine.runner.forward_passes["eager"] > len(PROMPTS)


def test_mixed_batch_logprobs_match_peft_within_1e3(served):
    path, loras, peft_model = served
    llm = lora_llm(path)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=VOCAB)
    outputs = llm.generate(PROMPTS, params, lora_request=requests_of(loras, ADAPTER_OF))
    for prompt, name, out in zip(PROMPTS, ADAPTER_OF, outputs):
        mine = torch.tensor([[entry[t] for t in range(VOCAB)] for entry in out.prompt_logprobs[1:]])
        want = reference(peft_model, name, lambda m: hf_logprobs(m, prompt))[:-1]
        assert (mine - want).abs().max() <= 1e-3, name
    base = reference(peft_model, None, lambda m: hf_logprobs(m, PROMPTS[0]))
    assert (reference(peft_model, "first", lambda m: hf_logprobs(m, PROMPTS[0])) - base).abs().max() > 0.1


def test_one_slot_serves_adapters_in_turn(served):
    """max_loras=1: a request whose adapter is not in the slot waits for the running ones to finish, then loads."""
    path, loras, peft_model = served
    llm = LLM(str(path), dtype="float32", device="cpu", enable_lora=True, max_loras=1, max_lora_rank=8)
    names = ["first", "second", None, "first"]
    outputs = llm.generate(PROMPTS[:4], greedy(6), lora_request=requests_of(loras, names))
    for prompt, name, out in zip(PROMPTS, names, outputs):
        assert out.outputs[0].token_ids == reference(peft_model, name, lambda m: hf_greedy(m, prompt, 6)), name


def test_prefix_cache_never_shares_blocks_between_adapters(served):
    path, loras, peft_model = served
    llm = lora_llm(path, block_size=4)
    prompt = random_prompt(21, seed=7)

    def run(name):
        out = llm.generate([prompt], greedy(4), lora_request=None if name is None else loras[name])[0]
        return out.num_cached_tokens, out.outputs[0].token_ids

    first = run("first")
    assert first[0] == 0
    for name in ("second", None):
        cached, tokens = run(name)
        assert cached == 0, name
        assert tokens == reference(peft_model, name, lambda m: hf_greedy(m, prompt, 4))
    cached, tokens = run("first")
    assert cached > 0 and tokens == first[1]


def test_two_tensor_parallel_ranks_give_peft_tokens(served):
    """Column-parallel projections keep their rows of B, row-parallel ones their columns of A."""
    path, loras, peft_model = served
    llm = lora_llm(path, tensor_parallel_size=2, max_num_batched_tokens=16)
    try:
        outputs = llm.generate(PROMPTS, greedy(6), lora_request=requests_of(loras, ADAPTER_OF))
    finally:
        llm.engine.close()
    for prompt, name, out in zip(PROMPTS, ADAPTER_OF, outputs):
        assert out.outputs[0].token_ids == reference(peft_model, name, lambda m: hf_greedy(m, prompt, 6)), name


def test_speculative_decoding_keeps_each_adapters_tokens(served):
    """The drafter proposes without adapters; verify steps run the target with each row's adapter, so the greedy
    tokens stay PEFT's."""
    path, loras, peft_model = served
    llm = lora_llm(path, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    prompts = [random_prompt(n, seed=n) for n in (1, 5, 9, 23, 40)]  # outputs that repeat: the n-gram lookup drafts
    outputs = llm.generate(prompts, greedy(30), lora_request=requests_of(loras, ADAPTER_OF))
    for prompt, name, out in zip(prompts, ADAPTER_OF, outputs):
        assert out.outputs[0].token_ids == reference(peft_model, name, lambda m: hf_greedy(m, prompt, 30)), name
    assert llm.engine.spec_stats.snapshot().num_drafts > 0


def test_the_triton_kernels_in_the_model_give_peft_tokens(served):
    """The model on the Triton backend (the interpreter on CPU): its LoRA layers run the Triton shrink and expand."""
    from atomlite.model_ops import kernels
    path, loras, peft_model = served
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm = LLM(str(path), dtype="float32", device=device, kernel_backend="triton", max_num_batched_tokens=16,
              enable_lora=True, max_loras=2, max_lora_rank=8)
    lora = llm.engine.model.model.layers[0].self_attn.qkv_proj.lora
    assert lora._expand is kernels.kernel("triton", "lora_expand").fn
    prompts, names = PROMPTS[:3], ADAPTER_OF[:3]
    outputs = llm.generate(prompts, greedy(4), lora_request=requests_of(loras, names))
    for prompt, name, out in zip(prompts, names, outputs):
        assert out.outputs[0].token_ids == reference(peft_model, name, lambda m: hf_greedy(m, prompt, 4)), name
