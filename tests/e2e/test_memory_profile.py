"""GPU memory sized by a profiling run: the split's arithmetic (CPU) and, on a GPU, the 31B-shaped model at the
default --gpu-memory-utilization serving a full --max-num-batched-tokens prefill beside a full decode batch."""
import pytest
import torch

from atomlite import LLM, SamplingParams
from atomlite.engine.kv.memory_profile import GiB, MemoryProfile


def test_kv_cache_gets_what_the_utilization_leaves():
    profile = MemoryProfile(total=80 * GiB, utilization=0.9, weights=57 * GiB, prefill_peak=2 * GiB,
                            graphs=GiB // 2, outside_torch=GiB // 2)
    assert profile.kv_budget == int(72 * GiB) - 60 * GiB
    text = profile.describe()
    assert "90% of 80.0 GiB" in text and "weights 57.00 GiB" in text and "KV cache 12.00 GiB" in text


@pytest.mark.gpu
def test_31b_at_default_utilization_serves_a_full_prefill_beside_a_full_decode_batch():
    llm = LLM("examples/configs/gemma-4-31B-it", load_format="dummy", dtype="bfloat16", max_model_len=4096,
              max_num_seqs=16)
    engine = llm.engine
    assert engine.memory is not None and engine.memory.kv_budget > 0
    torch.cuda.reset_peak_memory_stats()
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    decoders = [engine.add_request(f"d{i}", torch.randint(3, 1000, (8,), generator=g).tolist(), params)
                for i in range(15)]
    while not all(s.output_token_ids for s in decoders):
        engine.step()
    long = engine.add_request("long", torch.randint(3, 1000, (2048,), generator=g).tolist(),
                              SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():  # the next step carries 15 decodes and the prompt's first 2033-token chunk
        engine.step()
    assert long.is_finished and all(s.is_finished for s in decoders)
    # serving stays inside the share: weights, KV cache, graphs and the peak of a mixed step
    assert torch.cuda.max_memory_allocated() <= engine.memory.total * engine.config.gpu_memory_utilization
    assert all(used == 0 for _, used, _ in engine.kv.usage())


def test_the_largest_step_images_are_1120_token_images_filling_the_encoder_budget():
    from atomlite.engine.images.image_embeds import largest_step_images
    from atomlite.models.gemma4_vision import patch_layout
    pixels, positions = largest_step_images({"patch_size": 16, "pooling_kernel_size": 3}, 4096, 2500)
    assert len(pixels) == 2 and pixels[0].shape == (10080, 768)
    assert patch_layout(positions, 3).soft_tokens == [1120, 1120]  # whole 3x3 squares, as the processor gives
    small, _ = largest_step_images({}, 300, 2048)
    assert len(small) == 6 and small[0].shape[0] == 300 * 9


@pytest.mark.gpu
def test_a_vision_model_profiles_its_tower_at_the_largest_image_and_serves_it(checkpoints):
    from image_prompts import engine_greedy, image_prompt, items_of, vision_checkpoint
    path, _ = vision_checkpoint(checkpoints, "dense", "standardized", True)
    engine = LLM(str(path), dtype="float32", max_num_batched_tokens=1200).engine
    assert engine.memory.encoder_cache > 0 and "encoder cache" in engine.memory.describe()
    # the tower's attention is Triton's on a GPU: its peak at the 10080-patch image is the pixels and activations
    # (about 0.1 GB, the fp32 pixels and two temporaries of them), no [2 heads, T, T] fp32 scores (0.8 GB)
    assert "encoder_attention[dtype=torch.float32,gqa=1,head_dim=24]: triton" in "\n".join(engine.kernels.describe())
    assert 0 < engine.memory.encoder_peak < 2 * 10080 ** 2 * 4 // 4
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    prompt = image_prompt(items_of(["tall"], 1120))
    engine_greedy(engine, {"r": prompt}, 2)
    assert torch.cuda.max_memory_allocated() - before <= engine.memory.prefill_peak + engine.memory.encoder_cache
