"""Gemma 4's vision tower and projector: the patches of an image (or a video frame) -> its soft tokens in the text
model's width, checked against transformers' Gemma4VisionModel + Gemma4MultimodalEmbedder.

Input is what transformers' Gemma4ImageProcessor gives per image: pixel_values [patches, 3 * patch^2] in [0, 1] and
position ids [patches, 2] (x, y), padding rows at (-1, -1). The tower drops the padding rows, encodes each image's
real patches (several images packed, none seeing another), averages each pooling_kernel_size^2 square of patches
into one soft token (row by row over the image), scales by sqrt(hidden), standardizes where the config says so
(31B, 26B-A4B) and projects into the text width through a weightless RMSNorm and a Linear.
"""
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.norm import RMSNorm
from atomlite.model_ops.packed import PackedSequences
from atomlite.models.gemma4_vision_layers import VisionEncoder, VisionPatchEmbedder, loaded_parameter

TOWER_PREFIX, PROJECTOR_PREFIX = "model.vision_tower", "model.embed_vision"


@dataclass
class PatchLayout:
    """Where the real patches of a batch of images are, and which soft token each pools into; read on the host from
    the processor's position ids."""
    real_rows: list[torch.Tensor]  # per image, the indices of its real (not padding) rows
    positions: torch.Tensor  # [T, 2] (x, y) of every real patch, the images one after another
    soft_token_rows: torch.Tensor  # [T] the soft token (over all images' soft tokens) each real patch pools into
    soft_tokens: list[int]  # per image

    @property
    def lengths(self) -> list[int]:
        return [len(rows) for rows in self.real_rows]


def pooled_rows(positions: torch.Tensor, pool: int) -> torch.Tensor:
    """The soft token of each patch of one image: patches pool in pool x pool squares, numbered row by row."""
    width = int(positions[:, 0].max()) + 1
    squares = torch.div(positions, pool, rounding_mode="floor")
    return squares[:, 0] + (width // pool) * squares[:, 1]


def patch_layout(position_ids: Sequence[torch.Tensor], pool: int) -> PatchLayout:
    real_rows, positions, soft_token_rows, soft_tokens = [], [], [], []
    for i, image_positions in enumerate(position_ids):
        image_positions = image_positions.cpu()
        rows = (image_positions != -1).any(dim=-1).nonzero().squeeze(1)
        real = image_positions[rows]
        count = len(rows) // pool ** 2
        if len(rows) == 0 or len(rows) % pool ** 2:
            raise ValueError(f"image {i} has {len(rows)} real patches; pooling needs whole {pool}x{pool} squares of "
                             f"them: pass the Gemma 4 image processor's output as it is")
        cells = pooled_rows(real, pool)
        if int(cells.max()) >= count:
            raise ValueError(f"image {i}'s patches do not form a grid of whole {pool}x{pool} squares")
        real_rows.append(rows)
        positions.append(real)
        soft_token_rows.append(cells + sum(soft_tokens))
        soft_tokens.append(count)
    return PatchLayout(real_rows, torch.cat(positions), torch.cat(soft_token_rows), soft_tokens)


class VisionProjector(nn.Module):
    """Soft tokens into the text model's width: a weightless RMSNorm, then a Linear."""

    def __init__(self, vision_hidden: int, text_hidden: int, eps: float, lin: LinearBuilder, prefix: str):
        super().__init__()
        self.embedding_pre_projection_norm = RMSNorm(vision_hidden, eps, learned=False)
        self.embedding_projection = lin.linear(f"{prefix}.embedding_projection", vision_hidden, text_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding_projection(self.embedding_pre_projection_norm(x))


class Gemma4VisionTower(nn.Module):
    """Both tower shapes from the config alone: 31B/26B-A4B (standardize) and E2B/E4B (use_clipped_linears)."""

    def __init__(self, cfg: dict, text_hidden: int, lin: LinearBuilder):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.patch_embedder = VisionPatchEmbedder(cfg, lin, f"{TOWER_PREFIX}.patch_embedder")
        self.encoder = VisionEncoder(cfg, lin, f"{TOWER_PREFIX}.encoder")
        self.pool = cfg.get("pooling_kernel_size", 3)
        self.root_hidden = hidden ** 0.5
        self.standardize = bool(cfg.get("standardize"))
        if self.standardize:
            self.std_bias, self.std_scale = loaded_parameter(hidden), loaded_parameter(hidden)
            self.std_bias.dummy_fill = 0.0
        self.projector = VisionProjector(hidden, text_hidden, eps, lin, PROJECTOR_PREFIX)
        self.graphs = None  # TowerGraphs, once the engine sets them up (use_graphs)

    def use_graphs(self, max_soft_tokens: int, capture: bool = True):
        """Encode steps of up to max_soft_tokens soft tokens from graphs at bucketed patch counts (or, with
        capture=False, eagerly from the same padded buffers); returns the TowerGraphs."""
        from atomlite.models.gemma4_vision_graphs import TowerGraphs
        self.graphs = TowerGraphs(self, max_soft_tokens, capture)
        return self.graphs

    def forward(self, pixel_values: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """One image or frame: pixel_values [patches, 3 * patch^2], position_ids [patches, 2] -> its soft tokens
        [soft tokens, text hidden]."""
        return self.encode([pixel_values], [position_ids])[0]

    def encode(self, pixel_values: Sequence[torch.Tensor], position_ids: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Several images or frames (a list, or the processor's batch [images, patches, ...]), their real patches
        encoded in one pass: each one's soft tokens."""
        layout = patch_layout(position_ids, self.pool)
        if self.graphs is not None:
            encoded = self.graphs.encode(pixel_values, layout)
            if encoded is not None:
                return encoded
        device = self.patch_embedder.position_embedding_table.device
        pixels = torch.cat([values.index_select(0, rows.to(values.device)).to(device)
                            for values, rows in zip(pixel_values, layout.real_rows)])
        packed = PackedSequences.of(layout.lengths, device)
        soft_tokens = self.encode_rows(pixels, layout.positions.to(device), packed,
                                       layout.soft_token_rows.to(device), sum(layout.soft_tokens))
        return list(soft_tokens.split(layout.soft_tokens))

    def encode_rows(self, pixels: torch.Tensor, positions: torch.Tensor, packed: PackedSequences,
                    soft_token_rows: torch.Tensor, count: int) -> torch.Tensor:
        """Packed patches on the device -> [count, text hidden] soft tokens, row soft_token_rows[i] pooling patch i;
        nothing read back to the host (what a graph captures)."""
        h = self.encoder(self.patch_embedder(pixels, positions), positions, packed)
        return self.projector(self._pooled(h, soft_token_rows, count))

    def _pooled(self, h: torch.Tensor, soft_token_rows: torch.Tensor, count: int) -> torch.Tensor:
        """Each square's mean (rounded to h's dtype, as transformers does), times sqrt(hidden), standardized: in fp32,
        since the scaling can leave fp16's range and the standardization brings it back."""
        sums = torch.zeros(count, h.shape[1], dtype=torch.float32, device=h.device)
        sums.index_add_(0, soft_token_rows, h.float())
        pooled = (sums / self.pool ** 2).to(h.dtype).float() * self.root_hidden
        if self.standardize:
            pooled = (pooled - self.std_bias.float()) * self.std_scale.float()
        return pooled.to(h.dtype)
