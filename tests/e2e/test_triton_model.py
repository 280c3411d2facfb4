"""The whole model on the Triton kernels (the interpreter on CPU, compiled on a GPU) gives the torch backend's
greedy tokens."""
import pytest
import torch

from atomlite import LLM
from atomlite.model_ops import kernels
from helpers import greedy, random_prompt


@pytest.mark.parametrize("variant", ["dense", "moe", "ple"])
def test_triton_backend_gives_torch_backend_tokens(checkpoints, variant):
    path, _ = checkpoints.get(variant)
    prompts = [random_prompt(n, seed=n) for n in (3, 21)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    want = [o.outputs[0].token_ids for o in
            LLM(str(path), dtype="float32", device=device, kernel_backend="torch").generate(prompts, greedy(6))]
    llm = LLM(str(path), dtype="float32", device=device, kernel_backend="triton", max_num_batched_tokens=16)
    attention = llm.engine.model.attention_layers()[0]
    assert attention._attend is kernels.kernel("triton", "attention").fn
    experts = [layer.experts for layer in llm.engine.model.model.layers if layer.moe]
    assert bool(experts) == (variant == "moe")
    assert all(e._fn is kernels.kernel("triton", "moe_experts").fn and e.graph_safe for e in experts)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(6))] == want


@pytest.mark.parametrize("shape", ["standardized", "clipped"])
def test_the_vision_tower_on_triton_gives_the_torch_backends_soft_tokens(checkpoints, shape):
    """Both tiny towers (head_dim 24, padded to 32 in the kernel, and 16), two images packed in one encode."""
    from image_prompts import items_of, vision_checkpoint
    path, _ = vision_checkpoint(checkpoints, "dense", shape, True)
    items = items_of(["tall", "landscape"], 70)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    soft_tokens = {}
    for backend in ("torch", "triton"):
        engine = LLM(str(path), dtype="float32", device=device, kernel_backend=backend).engine
        (encoder,) = [line for line in engine.kernels.describe() if line.startswith("encoder_attention[")]
        assert f": {backend} " in encoder, encoder
        with torch.inference_mode():
            soft_tokens[backend] = engine.model.embed_images([i.pixel_values for i in items],
                                                             [i.image_position_ids for i in items])
    for got, want in zip(soft_tokens["triton"], soft_tokens["torch"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_gemma3_on_triton_gives_transformers_tokens(checkpoints):
    """Gemma 3's V goes to the cache un-normed (qk_norm_rope's v_norm=False) through the Triton kernels too."""
    from helpers import hf_greedy
    path, ref = checkpoints.gemma3("gemma3_linear_softcap")
    prompts = [random_prompt(n, seed=n) for n in (3, 21)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm = LLM(str(path), dtype="float32", device=device, kernel_backend="triton", max_num_batched_tokens=16)
    attention = llm.engine.model.attention_layers()[0]
    assert attention._attend is kernels.kernel("triton", "attention").fn
    assert attention.prepare_qkv is kernels.kernel("triton", "qk_norm_rope").fn
    for prompt, out in zip(prompts, llm.generate(prompts, greedy(6))):
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 6)
