"""The layers of Gemma 4's audio encoder (a USM-style conformer): the convolutional subsampling of the log-mel
features, the half-step feed-forward, local self-attention with relative positions, the light convolution module,
and the conformer block that chains them. Checked against transformers' Gemma4AudioModel.

They work on a padded batch of clips [B, T, hidden] with each clip's length in frames; a clip's frames never see
another clip's or the padding. Every linear is whole on every tensor-parallel rank: the tower is replicated.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from atomlite.errors import ConfigError
from atomlite.model_ops import dispatch
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.norm import RMSNorm
from atomlite.models.gemma4_vision_layers import VisionLinear, loaded_parameter

# transformers' Gemma4AudioConfig defaults, where a hub config.json leaves a field out
AUDIO_DEFAULTS = dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, hidden_act="silu",
                      subsampling_conv_channels=[128, 32], conv_kernel_size=5, residual_weight=0.5,
                      attention_chunk_size=12, attention_context_left=13, attention_context_right=0,
                      attention_logit_cap=50.0, attention_invalid_logits_value=-1.0e9, use_clipped_linears=True,
                      rms_norm_eps=1e-6, gradient_clipping=1e10, output_proj_dims=1536)

def audio_config(raw: dict) -> dict:
    cfg = {**AUDIO_DEFAULTS, **raw}
    if cfg["hidden_act"] != "silu":
        raise ConfigError(f"audio_config hidden_act {cfg['hidden_act']!r} is not supported (supported: silu)")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ConfigError(f"audio_config hidden_size {cfg['hidden_size']} is not a multiple of num_attention_heads "
                          f"{cfg['num_attention_heads']}")
    if cfg["attention_context_left"] < 2:
        raise ConfigError(f"audio_config attention_context_left {cfg['attention_context_left']} must be at least 2 "
                          f"(a frame sees itself and attention_context_left - 2 frames before it)")
    return cfg


def clamped(x: torch.Tensor, bound: float) -> torch.Tensor:
    """The conformer's gradient_clipping bound applied to activations, within the dtype's range."""
    bound = min(bound, torch.finfo(x.dtype).max)
    return torch.clamp(x, -bound, bound)


def valid_frames(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """[B, frames] True where a frame lies inside its clip."""
    return torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]


def halved(lengths: torch.Tensor) -> torch.Tensor:
    """Frames left after a stride-2 convolution that keeps every other frame (the first of each pair)."""
    return torch.div(lengths + 1, 2, rounding_mode="floor")


# The convolutions below are written as windows and a matmul (or a sum), not F.conv2d / F.conv1d: on ROCm those run
# MIOpen, whose solver search can invalidate a HIP graph capture (ROCm/rocm-libraries#12121), and the tower replays
# graphs (gemma4_audio_graphs).

def conv3x3_stride2(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.conv2d(x, weight, stride=2, padding=1): x [B, C, H, W], weight [O, C, 3, 3] -> [B, O, ceil(H/2), ceil(W/2)]."""
    windows = F.unfold(x, 3, padding=1, stride=2)  # [B, C * 9, H' * W']
    return (weight.flatten(1) @ windows).unflatten(2, ((x.shape[2] + 1) // 2, (x.shape[3] + 1) // 2))


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A depthwise convolution over time, x [B, T, C], weight [C, 1, K], in fp32: frame t reads t - K + 1 .. t, so a
    clip's padding never reaches its frames."""
    kernel = weight.shape[-1]
    windows = F.pad(x.float(), (0, 0, kernel - 1, 0)).unfold(1, kernel, 1)  # [B, T, C, K]
    return (windows * weight[:, 0].float()).sum(-1).to(x.dtype)


class SubsampleConv(nn.Module):
    """A 3x3 stride-2 Conv2d over (time, mel), a LayerNorm over channels (no bias), ReLU."""

    def __init__(self, in_channels: int, out_channels: int, eps: float):
        super().__init__()
        self.conv = nn.Module()
        self.conv.weight = loaded_parameter(out_channels, in_channels, 3, 3)
        self.norm = nn.Module()
        self.norm.weight = loaded_parameter(out_channels)
        self.eps = eps

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, C, T, F]; padding frames read as zero, as the convolution's own padding."""
        x = x * valid_frames(lengths, x.shape[2])[:, None, :, None].to(x.dtype)
        x = conv3x3_stride2(x.to(self.conv.weight.dtype), self.conv.weight)
        x = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.norm.weight, None, self.eps)
        return F.relu(x).permute(0, 3, 1, 2), halved(lengths)


class SubsampleProjection(nn.Module):
    """Log-mel frames [B, T, 128] -> [B, T / 4, hidden]: two subsampling convolutions, then a Linear over each
    frame's channels x mel bins."""

    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        first, second = cfg["subsampling_conv_channels"]
        self.layer0 = SubsampleConv(1, first, cfg["rms_norm_eps"])
        self.layer1 = SubsampleConv(first, second, cfg["rms_norm_eps"])
        # mel bins / 4 x channels in, written as transformers sizes it (the 128 bins equal the first channels)
        self.input_proj_linear = lin.linear(f"{prefix}.input_proj_linear", first // 4 * second, cfg["hidden_size"])

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, lengths = self.layer0(features[:, None], lengths)
        x, lengths = self.layer1(x, lengths)
        frames = x.permute(0, 2, 3, 1).flatten(2)  # [B, T, mel x channels]: each mel bin's channels together
        return self.input_proj_linear(frames), lengths


class AudioFeedForward(nn.Module):
    """The half-step feed-forward: norm, Linear, SiLU, Linear, norm, times residual_weight, added to its input."""

    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, clipped = cfg["hidden_size"], bool(cfg["use_clipped_linears"])
        self.ffw_layer_1 = VisionLinear(lin, f"{prefix}.ffw_layer_1", hidden, 4 * hidden, clipped)
        self.ffw_layer_2 = VisionLinear(lin, f"{prefix}.ffw_layer_2", 4 * hidden, hidden, clipped)
        self.pre_layer_norm = RMSNorm(hidden, cfg["rms_norm_eps"])
        self.post_layer_norm = RMSNorm(hidden, cfg["rms_norm_eps"])
        self.clip, self.scale = cfg["gradient_clipping"], cfg["residual_weight"]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.ffw_layer_2(F.silu(self.ffw_layer_1(self.pre_layer_norm(clamped(h, self.clip)))))
        return self.post_layer_norm(clamped(x, self.clip)) * self.scale + h


def relative_positions(cfg: dict) -> tuple[int, torch.Tensor]:
    """(the window's first key offset, and per window slot the relative position its keys are encoded at, -1 where
    transformers' blocked computation adds no positional term). Slot w holds key t + first + w of frame t: the frame
    itself and attention_context_left - 2 before it, attention_context_right - 1 after it."""
    left, right = cfg["attention_context_left"], cfg["attention_context_right"]
    past = left - 1
    first, window = -(left - 2), (left - 1) + max(right - 1, 0)
    middle = (cfg["attention_chunk_size"] + past + right) // 2  # the positions transformers encodes: middle .. 0
    slots = []
    for w in range(window):
        distance = -(first + w)
        index = past - distance
        slots.append(middle - index if 0 <= index <= middle else -1)
    return first, torch.tensor(slots)


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[len(positions), dim]: sin then cos of each position at dim / 2 timescales from 1 to 10^4."""
    count = dim // 2
    step = math.log(1e4) / max(count - 1, 1)
    angles = positions[:, None].float() * torch.exp(torch.arange(count) * -step)[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class AudioAttention(nn.Module):
    """Local self-attention: each frame sees a short window of its clip; relative-position keys, a learned per-dim
    query scale, soft-capped logits."""

    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, clipped = cfg["hidden_size"], bool(cfg["use_clipped_linears"])
        self.heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.heads
        for name in ("q_proj", "k_proj", "v_proj", "post"):
            setattr(self, name, VisionLinear(lin, f"{prefix}.{name}", hidden, hidden, clipped))
        self.relative_k_proj = lin.linear(f"{prefix}.relative_k_proj", hidden, hidden)
        self.per_dim_scale = loaded_parameter(self.head_dim)
        self.q_scale = self.head_dim ** -0.5 / math.log(2)
        self.k_scale = math.log(1 + math.e) / math.log(2)
        self.first_offset, slots = relative_positions(cfg)
        self.register_buffer("slot_positions", slots, persistent=False)
        self.register_buffer("slot_sinusoids", sinusoids(slots.clamp(min=0), hidden), persistent=False)
        self.softcap, self.invalid = cfg["attention_logit_cap"], cfg["attention_invalid_logits_value"]
        self.attend = dispatch.choose("local_attention", head_dim=self.head_dim, window=len(slots)).fn

    def relative_keys(self, dtype: torch.dtype) -> torch.Tensor:
        """[W, H, D] fp32: each window slot's positional key (zero where none is added)."""
        keys = self.relative_k_proj(self.slot_sinusoids.to(dtype)).float()
        keys = keys * (self.slot_positions >= 0)[:, None].to(keys.dtype)
        return keys.view(-1, self.heads, self.head_dim)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        shape = (*x.shape[:2], self.heads, self.head_dim)
        q = self.q_proj(x).float().view(shape) * (self.q_scale * F.softplus(self.per_dim_scale.float()))
        k = self.k_proj(x).float().view(shape) * self.k_scale
        v = self.v_proj(x).float().view(shape)
        out = self.attend(q, k, v, self.relative_keys(x.dtype), lengths, self.first_offset, self.softcap,
                          self.invalid)
        return self.post(out.flatten(2).to(x.dtype))


class LightConv(nn.Module):
    """Norm, Linear to a GLU, a causal depthwise convolution over time, norm, SiLU, Linear, added to its input."""

    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, clipped, eps = cfg["hidden_size"], bool(cfg["use_clipped_linears"]), cfg["rms_norm_eps"]
        self.linear_start = VisionLinear(lin, f"{prefix}.linear_start", hidden, 2 * hidden, clipped)
        self.linear_end = VisionLinear(lin, f"{prefix}.linear_end", hidden, hidden, clipped)
        self.depthwise_conv1d = nn.Module()
        self.depthwise_conv1d.weight = loaded_parameter(hidden, 1, cfg["conv_kernel_size"])
        self.pre_layer_norm = RMSNorm(hidden, eps)
        self.conv_norm = RMSNorm(hidden, eps)
        self.clip = cfg["gradient_clipping"]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = F.glu(self.linear_start(self.pre_layer_norm(h)), dim=-1)
        x = causal_depthwise_conv(x, self.depthwise_conv1d.weight)
        x = F.silu(self.conv_norm(clamped(x, self.clip)))
        return self.linear_end(x) + h


class ConformerLayer(nn.Module):
    def __init__(self, cfg: dict, lin: LinearBuilder, prefix: str):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.feed_forward1 = AudioFeedForward(cfg, lin, f"{prefix}.feed_forward1")
        self.feed_forward2 = AudioFeedForward(cfg, lin, f"{prefix}.feed_forward2")
        self.self_attn = AudioAttention(cfg, lin, f"{prefix}.self_attn")
        self.lconv1d = LightConv(cfg, lin, f"{prefix}.lconv1d")
        for name in ("norm_pre_attn", "norm_post_attn", "norm_out"):
            setattr(self, name, RMSNorm(hidden, eps))
        self.clip = cfg["gradient_clipping"]

    def forward(self, h: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.feed_forward1(h)
        attn = self.self_attn(self.norm_pre_attn(clamped(h, self.clip)), lengths)
        h = self.norm_post_attn(clamped(attn, self.clip)) + h
        h = self.feed_forward2(self.lconv1d(h))
        return self.norm_out(clamped(h, self.clip))
