"""Video frames against transformers' Gemma4VideoProcessor itself. It needs torchvision, which does not import on
atomlite's CPU machines (the test skips there; tests/unit/test_multimodal_video.py compares with its arithmetic):
run it where torchvision imports, e.g. the GPU machines."""
import numpy as np
import pytest
import torch

from atomlite.multimodal.processor import MultiModalProcessor
from atomlite.tokenizer import load_tokenizer
from vision_checkpoint import vision_model_dir

pytest.importorskip("torchvision")


@pytest.mark.parametrize("frames,height,width", [(3, 60, 80), (2, 480, 640), (1, 33, 700), (4, 48, 48),
                                                 (32, 90, 160), (40, 36, 64)])
def test_video_frames_equal_transformers_gemma4_video_processor(tmp_path, frames, height, width):
    from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor
    model_dir = vision_model_dir(tmp_path / "model")
    ours = MultiModalProcessor.from_model_dir(model_dir, load_tokenizer(model_dir))
    video = np.random.default_rng(height).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    want = Gemma4VideoProcessor()(videos=[video], return_tensors="pt", do_sample_frames=frames > 32)
    got = ours.process("<|video|>", videos=[video])
    assert len(got.items) == want["pixel_values_videos"].shape[0] == min(frames, 32)
    for k, item in enumerate(got.items):
        assert torch.equal(item.pixel_values, want["pixel_values_videos"][k]), k
        assert torch.equal(item.image_position_ids, want["video_position_ids"][k]), k
        assert item.num_soft_tokens == want["num_soft_tokens_per_video"][0]
