"""Gemma 4's audio tower and projector against transformers' own (Gemma4AudioModel + Gemma4MultimodalEmbedder),
float32, on tiny random towers with the real attention window and a wider one that sees frames ahead: the soft
tokens of clips the Gemma 4 feature extractor made, one at a time and clips of different lengths in one batch; the
local attention op against a dense masked attention, the convolutions against torch's; every tower tensor of the
checkpoint loaded."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

import tiny_models
from atomlite import LLM
from atomlite.loader import resolve
from atomlite.model_ops.torch_ref.local_attention import local_attention
from atomlite.models.gemma4_audio import soft_token_count
from atomlite.models.gemma4_audio_layers import causal_depthwise_conv, conv3x3_stride2


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    """A 16 kHz waveform: a tone under noise."""
    t = np.arange(int(16_000 * seconds)) / 16_000
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + 0.05 * noise).astype(np.float32)


def features_of(clips: list[np.ndarray]) -> tuple[dict, list[torch.Tensor]]:
    """(the extractor's padded batch, each clip's own frames)."""
    batch = Gemma4AudioFeatureExtractor()(clips, return_tensors="pt")
    own = [f[m] for f, m in zip(batch["input_features"], batch["input_features_mask"])]
    return batch, own


@pytest.fixture(scope="module", params=list(tiny_models.AUDIO))
def tower(request, checkpoints):
    path, ref = checkpoints.get("dense", audio=request.param)
    return LLM(str(path), dtype="float32", device="cpu", enable_prefix_caching=False).engine.model, ref


def transformers_soft_tokens(ref, batch: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        out = ref.model.get_audio_features(batch["input_features"], batch["input_features_mask"])
    return [tokens[mask] for tokens, mask in zip(out.pooler_output, out.attention_mask)]


@pytest.mark.parametrize("seconds", [[0.52], [1.3], [0.3, 1.1, 0.77]])
def test_soft_tokens_match_transformers(tower, seconds):
    model, ref = tower
    batch, own = features_of([clip(s, seed=i) for i, s in enumerate(seconds)])
    want = transformers_soft_tokens(ref, batch)
    with torch.no_grad():
        got = model.embed_audio(own)
    assert [len(g) for g in got] == [len(w) for w in want] == [soft_token_count(len(f)) for f in own]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4)


def test_a_clip_encodes_alike_alone_and_beside_a_longer_one(tower):
    model, _ = tower
    _, own = features_of([clip(0.4, seed=3), clip(1.5, seed=4)])
    with torch.no_grad():
        alone, together = model.embed_audio(own[:1])[0], model.embed_audio(own)[0]
    torch.testing.assert_close(alone, together, atol=1e-5, rtol=1e-5)


def dense_local_attention(q, k, v, rel_k, lengths, first_offset, softcap, invalid):
    """Every (frame, key) pair scored, keys outside the window or the clip masked: the op's meaning spelled out."""
    batch, frames, heads, _ = q.shape
    out = torch.zeros_like(q)
    for b in range(batch):
        for t in range(frames):
            for h in range(heads):
                scores = []
                for w in range(rel_k.shape[0]):
                    s = t + first_offset + w
                    inside = 0 <= s < int(lengths[b])
                    score = q[b, t, h] @ ((k[b, s, h] if inside else 0 * rel_k[w, h]) + rel_k[w, h])
                    scores.append(torch.tanh(score / softcap) * softcap if inside else torch.tensor(invalid))
                weights = torch.softmax(torch.stack(scores), 0)
                for w, weight in enumerate(weights):
                    s = t + first_offset + w
                    if 0 <= s < int(lengths[b]):
                        out[b, t, h] += weight * v[b, s, h]
    return out


@pytest.mark.parametrize("first_offset,window", [(-11, 12), (-4, 7)])
def test_local_attention_reference_matches_dense_masked_attention(first_offset, window):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 15, 2, 4, generator=g) for _ in range(3))
    rel_k = torch.randn(window, 2, 4, generator=g)
    lengths = torch.tensor([15, 9])
    got = local_attention(q, k, v, rel_k, lengths, first_offset, 5.0, -1e9)
    want = dense_local_attention(q, k, v, rel_k, lengths, first_offset, 5.0, -1e9)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1, :9], want[1, :9])


@pytest.mark.parametrize("shape", [(2, 1, 9, 128), (1, 3, 10, 7), (2, 4, 1, 1)])
def test_the_subsampling_convolution_is_torchs_conv2d(shape):
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(*shape, generator=g), torch.randn(5, shape[1], 3, 3, generator=g)
    torch.testing.assert_close(conv3x3_stride2(x, weight), F.conv2d(x, weight, stride=2, padding=1))


@pytest.mark.parametrize("kernel", [5, 3, 1])
def test_the_causal_depthwise_convolution_is_torchs_conv1d_padded_on_the_left(kernel):
    g = torch.Generator().manual_seed(kernel)
    x, weight = torch.randn(2, 11, 6, generator=g), torch.randn(6, 1, kernel, generator=g)
    want = F.conv1d(F.pad(x.transpose(1, 2), (kernel - 1, 0)), weight, groups=6).transpose(1, 2)
    torch.testing.assert_close(causal_depthwise_conv(x, weight), want)


def test_every_audio_tensor_of_the_checkpoint_is_loaded(tower):
    model, ref = tower
    names = [n for n in ref.state_dict() if n.startswith(("model.audio_tower.", "model.embed_audio."))]
    params = dict(model.named_parameters())
    targets = {resolve(model, n, params)[0] for n in names if resolve(model, n, params) is not None}
    assert {n for n in params if n.startswith("audio.")} == targets
    assert all(resolve(model, n, params) is not None for n in names if "rel_pos_enc" not in n)
