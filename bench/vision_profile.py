"""Where the vision tower's time goes, on a GPU: embed_images of one image (soft tokens from --max-soft-tokens) on
the 31B tower shape, its wall time against the GPU time its kernels take, and the kernels that take it.

    PYTHONPATH=. python bench/vision_profile.py [--model examples/configs/gemma-4-31B-it-vision] [--image 896x896]

Random weights (--load-format dummy), bf16. The text model is cut to two layers: the tower does not depend on it.
"""
import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.profiler import ProfilerActivity, profile

from atomlite import LLM
from atomlite.benchmarks.images import parse_image_size
from atomlite.multimodal.items import image_item
from atomlite.multimodal.processor import image_patch_spec


def two_layer_copy(model: Path, out: Path) -> Path:
    config = json.loads((model / "config.json").read_text())
    text = config["text_config"]
    text["num_hidden_layers"] = 2
    text["layer_types"] = text["layer_types"][:2]
    (out / "config.json").write_text(json.dumps(config))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="examples/configs/gemma-4-31B-it-vision")
    parser.add_argument("--image", default="896x896")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = two_layer_copy(Path(args.model), Path(tmp))
        engine = LLM(str(path), load_format="dummy", dtype="bfloat16", max_model_len=2048,
                     enforce_eager=True).engine
        width, height = parse_image_size(args.image)
        pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
        item = image_item(Image.fromarray(pixels), image_patch_spec(path), "image")
    model = engine.model
    print("\n".join(engine.kernels.describe()))

    def encode():
        with torch.inference_mode():
            return model.embed_images([item.pixel_values], [item.image_position_ids])
    for _ in range(3):
        encode()
    torch.cuda.synchronize()
    walls = []
    for _ in range(10):
        start = time.perf_counter()
        encode()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        encode()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0]
    by_name = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        by_name[e.name][0] += e.device_time
        by_name[e.name][1] += 1
    gpu_ms = sum(t for t, _ in by_name.values()) / 1e3
    print(f"image {args.image}: {item.num_soft_tokens} soft tokens; embed_images wall {statistics.median(walls) * 1e3:.2f} "
          f"ms (median of 10), kernels {gpu_ms:.2f} ms GPU time in {len(kernels)} launches")
    for name, (us, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{us / 1e3:>9.3f} ms {count:>5}x  {name[:110]}")
    for line in prof.key_averages().table(sort_by="cpu_time_total", row_limit=15).splitlines():
        print(line[:160])


if __name__ == "__main__":
    main()
