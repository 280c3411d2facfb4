"""The audio tower at bucketed clip lengths (gemma4_audio_graphs): a clip's frames in the static buffer, zeros after
them up to its bucket and its length in a device buffer, run eagerly on CPU (capture=False, what a graph replays),
against the tower's eager pass over the clip alone."""
import numpy as np
import pytest
import torch
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

import tiny_models
from atomlite import LLM
from atomlite.models.gemma4_audio import soft_token_count
from atomlite.models.gemma4_audio_graphs import clip_buckets


def clip_features(seconds: float, seed: int) -> torch.Tensor:
    """A tone under noise, as the Gemma 4 feature extractor's frames of it."""
    t = np.arange(int(16_000 * seconds)) / 16_000
    noise = np.random.default_rng(seed).standard_normal(len(t))
    samples = (0.3 * np.sin(2 * np.pi * (200 + 30 * seed) * t) + 0.05 * noise).astype(np.float32)
    batch = Gemma4AudioFeatureExtractor()([samples], return_tensors="pt")
    return batch["input_features"][0][batch["input_features_mask"][0]]


@pytest.fixture(scope="module", params=list(tiny_models.AUDIO))
def model(request, checkpoints):
    path, _ = checkpoints.get("dense", audio=request.param)
    model = LLM(str(path), dtype="float32", device="cpu", enable_prefix_caching=False).engine.model
    yield model
    model.audio.graphs = None


def eager(model, clips: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each clip encoded alone, without the graphs' buffers."""
    graphs, model.audio.graphs = model.audio.graphs, None
    try:
        return [model.embed_audio([features])[0] for features in clips]
    finally:
        model.audio.graphs = graphs


def test_clip_buckets_grow_by_5_seconds_up_to_the_longest_clip():
    assert clip_buckets(750) == [50, 125, 250, 375, 500, 625, 750]
    assert clip_buckets(300) == [50, 125, 250, 300]
    assert clip_buckets(40) == [40]


def test_padded_buckets_encode_as_the_eager_tower(model):
    """Clips of two lengths, each padded to a different bucket (13 soft tokens into 50, 58 into 125), alone and
    in one call."""
    clips = [clip_features(0.52, seed=1), clip_features(2.3, seed=2)]
    with torch.inference_mode():
        want = eager(model, clips)
        graphs = model.use_audio_graphs(750, capture=False)
        assert [graphs.bucket_for(len(f)) for f in clips] == [50, 125]
        together = model.embed_audio(clips)
        alone = [model.embed_audio([features])[0] for features in reversed(clips)][::-1]
    assert [len(t) for t in want] == [soft_token_count(len(f)) for f in clips] == [13, 58]
    assert graphs.out is not None  # the padded path ran, not the eager batch
    for got in (together, alone):
        assert [t.shape for t in got] == [t.shape for t in want]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_a_clip_longer_than_the_largest_bucket_runs_eager(model):
    clips = [clip_features(0.52, seed=1), clip_features(1.3, seed=3)]  # 13 and 33 soft tokens
    with torch.inference_mode():
        want = eager(model, clips)
        graphs = model.use_audio_graphs(20, capture=False)
        got = model.embed_audio(clips)
    assert graphs.bucket_for(len(clips[1])) is None and graphs.out is None
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_the_padded_forward_reads_nothing_back_to_the_host(model, monkeypatch):
    """What a capture needs: no Python value read from a tensor between the buffers and the soft tokens (a sync
    inside torch itself, as nonzero's, would still pass here; the gpu test below captures for real)."""
    graphs = model.use_audio_graphs(750, capture=False)
    graphs.frames.fill_(200)

    def host_read(*args, **kwargs):
        raise AssertionError("the padded forward read a tensor's value on the host")

    for name in ("item", "tolist", "numpy", "__int__", "__index__", "__float__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    with torch.inference_mode():
        out = graphs._forward(125)
    monkeypatch.undo()
    assert out.shape[0] == 750 and torch.isfinite(out[:50]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(tiny_models.AUDIO))
def test_audio_graph_replays_give_the_eager_soft_tokens(checkpoints, shape):
    """Captured at startup (the engine's default), replayed for clips of three lengths one after another, each
    after another bucket's, alone and together: the eager tower's soft tokens."""
    path, _ = checkpoints.get("dense", audio=shape)
    llm = LLM(str(path), dtype="float32", device="cuda", enable_prefix_caching=False, max_num_seqs=4,
              max_num_batched_tokens=512, kv_cache_memory=256 * 2**20)
    model, graphs = llm.engine.model, llm.engine.model.audio.graphs
    assert graphs is not None and set(graphs.graphs) == set(clip_buckets(512))
    assert "audio tower graphs: 6 sizes" in llm.engine.graph_note
    clips = [clip_features(seconds, seed) for seed, seconds in enumerate([9.5, 0.52, 2.3])]
    with torch.inference_mode():
        want = eager(model, clips)
        alone = [model.embed_audio([features])[0] for features in clips]
        together = model.embed_audio(clips)
    for got in (alone, together):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_the_memory_profile_counts_the_audio_graphs_pool(checkpoints):
    """The pool of one longest clip's graph (its peak), out of the KV budget as the vision tower's is."""
    path, _ = checkpoints.get("dense", audio="real_window")
    engine = LLM(str(path), dtype="float32", max_num_batched_tokens=1024, gpu_memory_utilization=0.3).engine
    assert engine.model.audio.graphs.sizes[-1] == 750
    assert engine.memory.audio_graphs > 0 and "audio tower graphs" in engine.memory.describe()
