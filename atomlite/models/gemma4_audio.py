"""Gemma 4's audio tower and projector (E2B/E4B): a clip's log-mel features -> its soft tokens in the text model's
width, checked against transformers' Gemma4AudioModel + Gemma4MultimodalEmbedder.

Input is what transformers' Gemma4AudioFeatureExtractor gives per clip, cut to the clip's own frames: [frames, 128]
log-mel features, 10 ms apart. Two stride-2 convolutions leave one frame per 40 ms; conformer layers encode them,
output_proj and a weightless RMSNorm + Linear bring them into the text width: one soft token per frame left.
"""
from collections.abc import Sequence

import torch
from torch import nn

from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.models.gemma4_audio_layers import ConformerLayer, SubsampleProjection, audio_config, halved
from atomlite.models.gemma4_vision import VisionProjector
from atomlite.models.gemma4_vision_layers import loaded_parameter

TOWER_PREFIX, PROJECTOR_PREFIX = "model.audio_tower", "model.embed_audio"


def soft_token_count(frames: int) -> int:
    """Soft tokens of a clip of `frames` log-mel frames: what the two stride-2 convolutions leave."""
    return int(halved(halved(torch.tensor([frames])))[0])


class Gemma4AudioTower(nn.Module):
    def __init__(self, raw: dict, text_hidden: int, lin: LinearBuilder):
        super().__init__()
        cfg = audio_config(raw)
        hidden = cfg["hidden_size"]
        self.subsample_conv_projection = SubsampleProjection(cfg, lin, f"{TOWER_PREFIX}.subsample_conv_projection")
        self.layers = nn.ModuleList(ConformerLayer(cfg, lin, f"{TOWER_PREFIX}.layers.{i}")
                                    for i in range(cfg["num_hidden_layers"]))
        self.output_proj = lin.linear(f"{TOWER_PREFIX}.output_proj", hidden, cfg["output_proj_dims"])
        self.output_proj.bias = loaded_parameter(cfg["output_proj_dims"])
        self.output_proj.bias.dummy_fill = 0.0
        self.projector = VisionProjector(cfg["output_proj_dims"], text_hidden, cfg["rms_norm_eps"], lin,
                                         PROJECTOR_PREFIX)

    def encode(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Clips of log-mel features ([frames, 128] each), encoded as one padded batch: each one's soft tokens
        [soft tokens, text hidden]."""
        device, dtype = self.output_proj.bias.device, self.output_proj.bias.dtype
        lengths = torch.tensor([len(f) for f in features], device=device)
        batch = nn.utils.rnn.pad_sequence([f.to(device, torch.float32) for f in features], batch_first=True)
        h, out_lengths = self.subsample_conv_projection(batch.to(dtype), lengths)
        for layer in self.layers:
            h = layer(h, out_lengths)
        soft_tokens = self.projector(self.output_proj(h) + self.output_proj.bias)
        return [clip[:n] for clip, n in zip(soft_tokens, (soft_token_count(len(f)) for f in features))]
