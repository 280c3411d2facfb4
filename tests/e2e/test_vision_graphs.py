"""The vision tower at bucketed patch counts (gemma4_vision_graphs): the static buffers, the padding rows as a
sequence of their own and the soft token they pool into, run eagerly on CPU (capture=False, what a graph replays),
against the tower's eager pass over the real patches alone."""
import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

import tiny_models
from atomlite import LLM
from atomlite.models.gemma4_vision_graphs import MAX_IMAGES, soft_token_buckets

SIZES = [(64, 48), (30, 90), (48, 48)]  # (width, height) of the source images


def images(count: int, max_soft_tokens: int = 70) -> dict:
    rng = np.random.default_rng(count)
    pictures = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
                for w, h in (SIZES[i % len(SIZES)] for i in range(count))]
    return Gemma4ImageProcessorPil(max_soft_tokens=max_soft_tokens)(images=pictures, return_tensors="pt")


@pytest.fixture(scope="module", params=list(tiny_models.VISION))
def model(request, checkpoints):
    path, _ = checkpoints.get("dense", vision=request.param)
    model = LLM(str(path), dtype="float32", device="cpu", enable_prefix_caching=False).engine.model
    yield model
    model.vision.graphs = None


def test_soft_token_buckets_grow_by_256_up_to_the_steps_largest():
    assert soft_token_buckets(2048) == [64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    assert soft_token_buckets(300) == [64, 128, 256, 300]
    assert soft_token_buckets(64) == [64]


@pytest.mark.parametrize("count,max_soft_tokens", [(1, 70), (3, 140), (2, 280)])
def test_padded_buckets_encode_as_the_eager_tower(model, count, max_soft_tokens):
    batch = images(count, max_soft_tokens)
    with torch.inference_mode():
        model.vision.graphs = None
        eager = model.embed_images(batch["pixel_values"], batch["image_position_ids"])
        graphs = model.use_image_graphs(1024, capture=False)
        padded = model.embed_images(batch["pixel_values"], batch["image_position_ids"])
    assert [t.shape for t in padded] == [t.shape for t in eager]
    # Float32 GEMMs over the bucket's rows and over the real patches alone may round a row differently (the CPU BLAS
    # blocks by row count: up to 3.6e-7 apart on an AMD EPYC); a padding row leaking into a real one would move it by
    # orders more.
    for got, want in zip(padded, eager):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert graphs.out is not None  # the padded path ran, not the eager fallback


def test_a_step_of_more_images_than_a_graph_takes_runs_eager(model):
    batch = images(MAX_IMAGES + 1)
    with torch.inference_mode():
        model.vision.graphs = None
        eager = model.embed_images(batch["pixel_values"], batch["image_position_ids"])
        graphs = model.use_image_graphs(4096, capture=False)
        again = model.embed_images(batch["pixel_values"], batch["image_position_ids"])
    assert graphs.out is None
    for got, want in zip(again, eager):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(tiny_models.VISION))
def test_tower_graph_replays_give_the_eager_soft_tokens(checkpoints, shape):
    """Captured at startup (the engine's default), replayed for steps of 1-3 images of different sizes, each step
    after another bucket's: the eager tower's soft tokens."""
    path, _ = checkpoints.get("dense", vision=shape)
    llm = LLM(str(path), dtype="float32", device="cuda", enable_prefix_caching=False, max_num_seqs=4,
              max_num_batched_tokens=512, kv_cache_memory=256 * 2**20)
    model, graphs = llm.engine.model, llm.engine.model.vision.graphs
    assert graphs is not None and set(graphs.graphs) == set(soft_token_buckets(512))
    assert "vision tower graphs: 4 sizes" in llm.engine.graph_note
    for count, max_soft_tokens in [(2, 280), (1, 70), (3, 140)]:
        batch = images(count, max_soft_tokens)
        with torch.inference_mode():
            replayed = model.embed_images(batch["pixel_values"], batch["image_position_ids"])
            model.vision.graphs = None
            eager = model.embed_images(batch["pixel_values"], batch["image_position_ids"])
            model.vision.graphs = graphs
        for got, want in zip(replayed, eager):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_graphs_stay_off_where_the_encoder_attention_reads_host_lengths(model):
    """The reference loops over the images by the host's lengths: a graph would replay the captured ones."""
    assert model.image_graphs_off_reason() == "torch encoder attention reads the images' lengths on the host"
