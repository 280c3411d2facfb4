"""Every kernel a model is given is capture-safe or declared unsafe. Where one is not (here the torch reference
attention, serving a global head_dim the Triton attention refuses), the engine decodes eager, says which kernel and
why, and still gives transformers' tokens."""
import pytest
import torch

from atomlite import LLM
from atomlite.engine.runner.decode_graphs import graphs_off_reason
from helpers import greedy, hf_greedy, hf_logprobs, random_prompt

GLOBAL_HEAD_DIM = 48  # not a power of two: the Triton attention refuses it, the torch reference serves it
PROMPTS = [random_prompt(n, seed=n) for n in (1, 9, 23)]  # 23: longer than the sliding window (8)
NEW_TOKENS = 8


def the_unsafe_kernel(llm: LLM) -> tuple[str, str]:
    """The one graph-unsafe kernel the model was given: (its key, "backend: why")."""
    unsafe = llm.engine.kernels.graph_unsafe()
    assert len(unsafe) == 1, unsafe
    return next(iter(unsafe.items()))


def test_attention_left_to_the_torch_reference_makes_decode_eager_and_says_why(checkpoints):
    """Triton everywhere it serves, as on a GPU (the interpreter on CPU), float32: the reason the startup report
    gives, and greedy tokens equal to transformers'."""
    path, ref = checkpoints.get("dense", global_head_dim=GLOBAL_HEAD_DIM)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm = LLM(str(path), dtype="float32", device=device, kernel_backend="triton")
    key, why = the_unsafe_kernel(llm)
    assert key.startswith("attention[") and f"head_dim={GLOBAL_HEAD_DIM}" in key
    assert f"head_dim {GLOBAL_HEAD_DIM} is not a power of two" in llm.engine.kernels.made[key].reason
    assert why.startswith("torch: ") and "back to the host" in why
    reason = graphs_off_reason(torch.device("cuda"), enforce_eager=False, kernels=llm.engine.kernels)
    assert reason == f"off, decode runs eager: {key} ({why}) cannot be captured"
    if device == "cuda":
        assert llm.engine.graph_note == f"decode graphs: {reason}" and llm.engine.runner.graphs is None
    prompts, new_tokens = (PROMPTS, NEW_TOKENS) if device == "cuda" else (PROMPTS[1:], 4)  # the interpreter is slow
    outputs = llm.generate(prompts, greedy(new_tokens))
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, new_tokens), len(prompt)


def assert_greedy_under_transformers(ref, prompt: list[int], tokens: list[int], tolerance: float) -> None:
    """Each token is transformers' (float32) most likely one after the same prefix, or within `tolerance` nats of
    it: bf16 rounding may swap two near-equal tokens, a wrong result picks tokens far down the distribution."""
    logprobs = hf_logprobs(ref, prompt + tokens)[len(prompt) - 1:-1]
    for step, (token, row) in enumerate(zip(tokens, logprobs)):
        best = int(row.argmax())
        assert row[token] >= row[best] - tolerance, (f"step {step}: {token} at {row[token]:.4f}, transformers' "
                                                     f"{best} at {row[best]:.4f}")


@pytest.mark.gpu
def test_bf16_model_on_the_torch_attention_starts_with_decode_graphs_on_and_decodes_eager(checkpoints):
    """What failed before: capturing decode graphs hit the reference attention's host read at startup."""
    path, ref = checkpoints.get("dense", global_head_dim=GLOBAL_HEAD_DIM)
    llm = LLM(str(path), dtype="bfloat16", device="cuda", kv_cache_memory=256 * 2**20)  # graphs not turned off
    key, why = the_unsafe_kernel(llm)
    assert key.startswith("attention[") and f"head_dim={GLOBAL_HEAD_DIM}" in key and why.startswith("torch: ")
    assert llm.engine.graph_note == f"decode graphs: off, decode runs eager: {key} ({why}) cannot be captured"
    assert llm.engine.runner.graphs is None
    outputs = llm.generate(PROMPTS, greedy(NEW_TOKENS))
    for prompt, out in zip(PROMPTS, outputs):
        assert_greedy_under_transformers(ref, prompt, out.outputs[0].token_ids, tolerance=0.05)
