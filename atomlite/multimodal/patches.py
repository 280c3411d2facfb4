"""Gemma 4's pixels for the vision tower: an aspect-preserving resize to a patch budget, [0, 1] rescale, 16-px
patches in rows, padded to the budget. Images resize with Pillow's bicubic filter (transformers'
Gemma4ImageProcessorPil); video frames with torch's antialiased bicubic on uint8, as transformers'
Gemma4VideoProcessor resizes them through torchvision on the CPU."""
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)
# k * (1/255) in float64, then float32: the image processor's rescale; the video processor's fused
# normalize (k / 255.0 in float32) gives the same 256 values.
_UNIT_SCALE = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)


@dataclass(frozen=True)
class PatchSpec:
    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 280

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size ** 2

    @property
    def side_multiple(self) -> int:
        return self.patch_size * self.pooling_kernel_size


def fitted_size(height: int, width: int, spec: PatchSpec) -> tuple[int, int]:
    """The largest (height, width), multiples of patch * pooling, that keep the aspect ratio within the patch
    budget; a side that would round to 0 gets one multiple and the other side the ratio, capped."""
    unit, budget_px = spec.side_multiple, spec.max_patches * spec.patch_size ** 2
    scale = math.sqrt(budget_px / (height * width))
    h = math.floor(scale * height / unit) * unit
    w = math.floor(scale * width / unit) * unit
    if h == 0 and w == 0:
        raise ValueError(f"a {width}x{height} image cannot be fitted to {unit}-pixel multiples")
    longest = spec.max_soft_tokens * unit
    if h == 0:
        h, w = unit, min(math.floor(width / height) * unit, longest)
    elif w == 0:
        h, w = min(math.floor(height / width) * unit, longest), unit
    if h * w > budget_px:
        raise ValueError(f"a {width}x{height} image fitted to {w}x{h} exceeds {spec.max_patches} patches")
    return h, w


def resize_image(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image
    height, width = size
    if rgb.shape[:2] == (height, width):
        return rgb
    return np.asarray(Image.fromarray(rgb).resize((width, height), resample=Image.Resampling.BICUBIC))


def resize_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[T, H, W, 3] uint8 -> [T, height, width, 3] uint8."""
    if frames.shape[1:3] == tuple(size):
        return frames
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    out = torch.nn.functional.interpolate(video.contiguous(), size=list(size), mode="bicubic", antialias=True,
                                          align_corners=False)
    return out.permute(0, 2, 3, 1).numpy()


def patchify(rgb: np.ndarray, spec: PatchSpec) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A resized [H, W, 3] uint8 image -> (pixel_values [max_patches, p*p*3], position ids [max_patches, 2],
    soft tokens). Each row is one patch, its pixels row by row, channels innermost."""
    p = spec.patch_size
    rows, cols = rgb.shape[0] // p, rgb.shape[1] // p
    patches = rgb.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, p * p * 3)
    pixel_values = np.zeros((spec.max_patches, p * p * 3), dtype=np.float32)
    pixel_values[:rows * cols] = _UNIT_SCALE[patches]
    positions = np.full((spec.max_patches, 2), -1, dtype=np.int64)
    positions[:rows * cols, 0] = np.tile(np.arange(cols), rows)
    positions[:rows * cols, 1] = np.repeat(np.arange(rows), cols)
    return torch.from_numpy(pixel_values), torch.from_numpy(positions), rows * cols // spec.pooling_kernel_size ** 2


def content_hash(rgb: np.ndarray, spec: PatchSpec, resize: str) -> bytes:
    """sha256 of the decoded pixels (shape included) and every setting that changes pixel_values."""
    h = hashlib.sha256()
    h.update(f"{rgb.shape}|{spec.patch_size}|{spec.pooling_kernel_size}|{spec.max_soft_tokens}|{resize}|".encode())
    h.update(np.ascontiguousarray(rgb).data)
    return h.digest()
