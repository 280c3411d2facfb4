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
        self.graphs = None  # ClipGraphs, once the engine sets them up (use_graphs)

    def use_graphs(self, max_soft_tokens: int):
        """Encode clips of up to max_soft_tokens soft tokens from padded buffers at bucketed frame counts: from
        graphs once ClipGraphs.capture_all has run, eagerly before; returns the ClipGraphs."""
        from atomlite.models.gemma4_audio_graphs import ClipGraphs
        self.graphs = ClipGraphs(self, max_soft_tokens)
        return self.graphs

    def encode(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Clips of log-mel features ([frames, 128] each): each one's soft tokens [soft tokens, text hidden]. From
        the graphs one clip at a time where they take every clip; else as one padded batch."""
        if self.graphs is not None and all(self.graphs.bucket_for(len(f)) is not None for f in features):
            return [self.graphs.encode(f) for f in features]
        device = self.output_proj.bias.device
        lengths = torch.tensor([len(f) for f in features], device=device)
        batch = nn.utils.rnn.pad_sequence([f.to(device, torch.float32) for f in features], batch_first=True)
        soft_tokens = self.encode_padded(batch, lengths)
        return [clip[:n] for clip, n in zip(soft_tokens, (soft_token_count(len(f)) for f in features))]

    def encode_padded(self, batch: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """A padded batch of clips [B, frames, 128] fp32 and their lengths in frames (on the device) -> [B, soft
        tokens of the padded length, text hidden]; a clip's padding never reaches its soft tokens, and nothing is
        read back to the host (what a graph captures)."""
        h, out_lengths = self.subsample_conv_projection(batch.to(self.output_proj.bias.dtype), lengths)
        for layer in self.layers:
            h = layer(h, out_lengths)
        return self.projector(self.output_proj(h) + self.output_proj.bias)
