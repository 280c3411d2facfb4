"""A video as Gemma 4 reads it: at most 32 frames sampled evenly, each labelled with its time as mm:ss.
The sampling and the timestamps are transformers' (Gemma4VideoProcessor's defaults: uniform indices
i * total // num_frames; time = index / fps, fps 24 when unknown)."""
from dataclasses import dataclass

import numpy as np

MAX_FRAMES = 32
DEFAULT_FPS = 24.0


@dataclass(frozen=True)
class SampledVideo:
    frames: np.ndarray  # [T, H, W, 3] uint8
    timestamps: list[float]  # seconds


def sample_indices(total: int, num_frames: int = MAX_FRAMES) -> list[int]:
    """All frames up to num_frames; beyond it num_frames spread evenly (transformers raises for a video shorter
    than num_frames: here it keeps every frame)."""
    if total <= num_frames:
        return list(range(total))
    return [i * total // num_frames for i in range(num_frames)]


def timestamp_text(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def sampled_video(video, where: str) -> SampledVideo:
    """A video given as frames: a [T, H, W, 3] uint8 array, a list of frames (PIL images or arrays, one size), or
    vLLM's (frames, metadata) with metadata's fps and frames_indices (the original index of each frame given)."""
    from atomlite.multimodal.items import rgb_array
    frames, metadata = video if isinstance(video, tuple) else (video, {})
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: a (frames, metadata) video needs metadata as a dict (fps, frames_indices)")
    if isinstance(frames, np.ndarray) and frames.ndim == 4:
        frames = list(frames)
    if not isinstance(frames, (list, tuple)) or not frames:
        raise ValueError(f"{where}: a video is a non-empty list of frames or a [T, H, W, 3] uint8 array")
    arrays = [rgb_array(f, f"{where}[{i}]") for i, f in enumerate(frames)]
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"{where}: every frame of a video must have the same size")
    indices = list(metadata.get("frames_indices") or range(len(arrays)))
    if len(indices) != len(arrays):
        raise ValueError(f"{where}: metadata frames_indices has {len(indices)} entries for {len(arrays)} frames")
    fps = float(metadata.get("fps") or DEFAULT_FPS)
    if fps <= 0:
        raise ValueError(f"{where}: metadata fps must be positive")
    keep = sample_indices(len(arrays))
    return SampledVideo(np.stack([arrays[k] for k in keep]), [indices[k] / fps for k in keep])
