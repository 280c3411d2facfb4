"""Video frames as Gemma 4 reads them, against transformers' Gemma4VideoProcessor. Its preprocessing needs
torchvision, which does not import here: the pixels are compared with the arithmetic read from it (CPU uint8 bicubic
resize with antialias, which torchvision hands to torch.nn.functional.interpolate; x / 255 in float32; the same
patches and padding, through transformers' own helpers), the prompt text with its processor's replace_video_token,
the sampled indices with its default sampler. Its helpers import only beside torchvision, so the reference below
restates them in torch. tests/e2e/test_video_processor_parity.py compares with the video processor itself where
torchvision imports."""
import numpy as np
import pytest
import torch
from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
from transformers.video_utils import VideoMetadata, default_sample_indices_fn

from atomlite.multimodal.processor import MultiModalProcessor
from atomlite.multimodal.video import sample_indices, sampled_video
from atomlite.tokenizer import load_tokenizer
from vision_checkpoint import reference_processor, vision_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vision_model_dir(tmp_path_factory.mktemp("vision") / "model")


def random_video(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def video_processor_pixels(video: np.ndarray, max_soft_tokens: int = 70):
    """Gemma4VideoProcessor._preprocess on one video, its torchvision resize done as torchvision does it on CPU."""
    frames = torch.from_numpy(video).permute(0, 3, 1, 2).contiguous()
    size = get_aspect_ratio_preserving_size(frames.shape[2], frames.shape[3], 16, max_soft_tokens * 9, 3)
    if tuple(size) != tuple(frames.shape[2:]):
        frames = torch.nn.functional.interpolate(frames, size=list(size), mode="bicubic", antialias=True)
    std = torch.tensor([1.0, 1.0, 1.0]) * (1.0 / (1 / 255))  # the fused rescale + normalize of the processor
    frames = frames.to(torch.float32).sub(0.0).div(std[None, :, None, None])
    t, c, h, w = frames.shape
    rows, cols = h // 16, w // 16
    patches = frames.reshape(t, c, rows, 16, cols, 16).permute(0, 2, 4, 3, 5, 1).reshape(t, rows * cols, -1)
    grid = torch.stack(torch.meshgrid(torch.arange(cols), torch.arange(rows), indexing="xy"), dim=-1)
    positions = grid.reshape(rows * cols, 2)[None].repeat(t, 1, 1)
    padding = max_soft_tokens * 9 - rows * cols
    patches = torch.nn.functional.pad(patches, [0, 0, 0, padding], value=0)
    positions = torch.nn.functional.pad(positions, [0, 0, 0, padding], value=-1)
    return patches, positions, rows * cols // 9


@pytest.mark.parametrize("frames,height,width", [(3, 60, 80), (2, 480, 640), (1, 33, 700), (4, 48, 48)])
def test_video_frame_pixels_equal_the_video_processors_arithmetic(model_dir, frames, height, width):
    processor = MultiModalProcessor.from_model_dir(model_dir, load_tokenizer(model_dir))
    video = random_video(frames, height, width, seed=height)
    pixels, positions, soft_tokens = video_processor_pixels(video)
    got = processor.process("<|video|>", videos=[video])
    assert len(got.items) == frames
    for k, item in enumerate(got.items):
        assert torch.equal(item.pixel_values, pixels[k])
        assert torch.equal(item.image_position_ids, positions[k])
        assert item.num_soft_tokens == soft_tokens


@pytest.mark.parametrize("total,fps", [(45, 10.0), (32, 24.0), (7, 2.0), (1000, 29.97)])
def test_video_prompt_equals_transformers_replace_video_token(model_dir, total, fps):
    processor = MultiModalProcessor.from_model_dir(model_dir, load_tokenizer(model_dir))
    reference = reference_processor(model_dir)
    video = random_video(min(total, 40), 40, 56, seed=total)
    indices = list(range(len(video)))
    got = processor.process("Watch: <|video|> now", videos=[(video, {"fps": fps, "frames_indices": indices})])
    kept = sample_indices(len(video))
    metadata = VideoMetadata(total_num_frames=len(video), fps=fps, frames_indices=kept)
    expansion = reference.replace_video_token({"num_soft_tokens_per_video": [got.items[0].num_soft_tokens],
                                               "video_metadata": [metadata]}, 0)
    want = reference.tokenizer.encode(f"Watch: {expansion} now")
    assert got.prompt_token_ids == want


@pytest.mark.parametrize("total", [32, 33, 45, 100, 1001])
def test_long_videos_sample_transformers_uniform_indices(total):
    metadata = VideoMetadata(total_num_frames=total, fps=24.0)
    assert sample_indices(total) == default_sample_indices_fn(metadata, num_frames=32).tolist()
    assert sample_indices(5) == [0, 1, 2, 3, 4]  # transformers refuses fewer frames than 32; we keep them all


def test_frame_timestamps_come_from_original_indices_and_fps():
    video = random_video(40, 16, 16)
    sampled = sampled_video((video, {"fps": 4.0}), "video")
    assert len(sampled.frames) == 32
    assert sampled.timestamps == [i * 40 // 32 / 4.0 for i in range(32)]
    assert sampled_video(list(video[:3]), "video").timestamps == [0.0, 1 / 24, 2 / 24]  # fps 24 when not given


def test_frames_of_different_sizes_are_an_error_naming_the_video():
    with pytest.raises(ValueError, match=r"videos\[0\]: every frame of a video must have the same size"):
        sampled_video([np.zeros((16, 16, 3), np.uint8), np.zeros((16, 20, 3), np.uint8)], "videos[0]")
