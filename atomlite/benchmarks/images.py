"""`atomlite bench latency --images-per-prompt N --image-size WxH`: the TTFT of a prompt carrying N synthetic images
against a text-only prompt of as many tokens (the two alternate in one run), and the vision tower alone in images per
second against its FLOPs at the probed GEMM rate. Prompts are token ids (boi, the image's soft-token placeholders,
eoi, then random text), so a config.json without a tokenizer (--load-format dummy) serves."""
import statistics
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from atomlite.benchmarks.offline import row, time_to_first_token, tpot_rows, warm_up
from atomlite.benchmarks.roofline import Probes, median_seconds, prefill_roofline
from atomlite.config import VisionSpec
from atomlite.multimodal.inputs import ImageItem, MultiModalPrompt, placeholder_runs
from atomlite.multimodal.items import image_item
from atomlite.multimodal.processor import image_patch_spec

ENCODER_REPEATS = 10


@dataclass(frozen=True, slots=True)
class ImageLoad:
    per_prompt: int
    width: int
    height: int

    def describe(self) -> str:
        return f"{self.per_prompt} image{'s' if self.per_prompt > 1 else ''} of {self.width}x{self.height}"


def parse_image_size(text: str) -> tuple[int, int]:
    """'896x896' -> (width, height)."""
    width, sep, height = text.lower().partition("x")
    if not (sep and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
        raise ValueError(f"--image-size {text!r} not understood: give WIDTHxHEIGHT in pixels, e.g. 896x896")
    return int(width), int(height)


def synthetic_items(engine, load: ImageLoad, seed: int) -> list[ImageItem]:
    """load.per_prompt images of seeded random pixels, through the processor's pixel path (resize, patches, hash):
    another seed gives other pixels, hence other content hashes the encoder cache has never seen."""
    from PIL import Image
    spec = image_patch_spec(engine.config.model_spec.path)
    rng = np.random.default_rng(seed)
    pixels = [rng.integers(0, 256, (load.height, load.width, 3), dtype=np.uint8) for _ in range(load.per_prompt)]
    return [image_item(Image.fromarray(p), spec, f"synthetic image {i}") for i, p in enumerate(pixels)]


def text_token_ids(vocab_size: int, vision: VisionSpec) -> torch.Tensor:
    """The ids random text may use: none of the vision tokens, which would read as placeholders."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[:3] = False  # pad, eos, bos
    allowed[[vision.image_token_id, vision.video_token_id, vision.boi_token_id, vision.eoi_token_id]] = False
    return allowed.nonzero().squeeze(1)


def random_text(ids: torch.Tensor, length: int, generator: torch.Generator) -> list[int]:
    return ids[torch.randint(len(ids), (length,), generator=generator)].tolist()


def image_prompt(vision: VisionSpec, items: list[ImageItem], text: list[int]) -> MultiModalPrompt:
    """Each image as the processor expands it (boi, its soft-token placeholders, eoi), then the text."""
    ids = []
    for item in items:
        ids += [vision.boi_token_id] + [vision.image_token_id] * item.num_soft_tokens + [vision.eoi_token_id]
    ids += text
    return MultiModalPrompt(ids, items, placeholder_runs(ids, {vision.image_token_id}))


def vision_tower_flops(cfg: dict, text_hidden: int, patches: int) -> float:
    """One image of `patches` real patches: the patch embedding, each layer's q/k/v/o and gated-MLP GEMMs and its
    attention over the image's patches (scores and values), and the projection of the pooled soft tokens into the
    text width; norms, RoPE and pooling are elementwise and left out."""
    hidden, heads, head_dim = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    attention_weights = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    layer = (2 * patches * (attention_weights + 3 * hidden * cfg["intermediate_size"])
             + 4 * patches ** 2 * heads * head_dim)
    embedding = 2 * patches * 3 * cfg.get("patch_size", 16) ** 2 * hidden
    soft_tokens = patches // cfg.get("pooling_kernel_size", 3) ** 2
    return embedding + cfg["num_hidden_layers"] * layer + 2 * soft_tokens * hidden * text_hidden


def check_soft_tokens(engine, items: list[ImageItem]) -> None:
    """The tower gives each image its soft tokens at the text width, all finite: checked before it is timed."""
    with torch.inference_mode():
        encoded = engine.model.embed_images([i.pixel_values for i in items], [i.image_position_ids for i in items])
    width = engine.config.model_spec.hf["hidden_size"]
    for i, (item, soft) in enumerate(zip(items, encoded, strict=True)):
        if tuple(soft.shape) != (item.num_soft_tokens, width) or not torch.isfinite(soft).all():
            raise RuntimeError(f"the vision tower gave image {i} soft tokens of shape {list(soft.shape)} (finite: "
                               f"{bool(torch.isfinite(soft).all())}); expected [{item.num_soft_tokens}, {width}]")


def encoder_row(engine, probes: Probes, load: ImageLoad, items: list[ImageItem]) -> dict:
    """embed_images on one prompt's images, as a prefill step calls it (pixels from the host), warm."""
    check_soft_tokens(engine, items)
    pixels, positions = [i.pixel_values for i in items], [i.image_position_ids for i in items]
    with torch.inference_mode():
        seconds = median_seconds(lambda: engine.model.embed_images(pixels, positions), engine.device,
                                 ENCODER_REPEATS)
    vision = engine.model.vision_spec
    pool = vision.hf.get("pooling_kernel_size", 3)
    text_hidden = engine.config.model_spec.hf["hidden_size"]
    flops = sum(vision_tower_flops(vision.hf, text_hidden, i.num_soft_tokens * pool ** 2) for i in items)
    roofline = flops / probes.gemm_flops_per_s
    soft = items[0].num_soft_tokens
    result = row(f"vision tower, {load.describe()}", seconds, roofline,
                 f"{flops / 1e12:.3f} TFLOP ({soft} soft tokens, {soft * pool ** 2} patches an image) at the probed "
                 f"GEMM rate")
    result["images_per_s"] = len(items) / seconds
    result["roofline_images_per_s"] = len(items) / roofline
    result["note"] = (f"embed_images alone, the same pixels each of {ENCODER_REPEATS} calls (no encoder cache on "
                      f"this path)")
    return result


def image_ttft_rows(engine, probes: Probes, load: ImageLoad, text_len: int, repeats: int, seed: int) -> list[dict]:
    """TTFT of text_len random tokens after the images against a text-only prompt of the same length, alternating;
    each image prompt carries fresh images, so the encoder cache never serves them (counted)."""
    vision, embedder = engine.model.vision_spec, engine.runner.images
    ids, g = text_token_ids(engine.vocab_size, vision), torch.Generator().manual_seed(seed)

    def prompt(k: int) -> MultiModalPrompt:
        return image_prompt(vision, synthetic_items(engine, load, seed + k), random_text(ids, text_len, g))
    warm = prompt(0)
    total = len(warm.prompt_token_ids)
    time_to_first_token(engine, warm)  # compiles the tower's kernels and the image step's
    time_to_first_token(engine, random_text(ids, total, g))
    encoded_before, text_ttfts, image_ttfts = embedder.num_encoded, [], []
    for k in tqdm(range(1, repeats + 1), desc="TTFT, text and images", leave=False):
        text_ttfts.append(time_to_first_token(engine, random_text(ids, total, g)))
        image_ttfts.append(time_to_first_token(engine, prompt(k)))
    encoded = embedder.num_encoded - encoded_before
    if encoded != repeats * load.per_prompt:
        raise RuntimeError(f"the tower encoded {encoded} images over {repeats} prompts of {load.per_prompt}: the "
                           f"timed TTFTs did not each run it")
    roofline, what, _ = prefill_roofline(engine.model, engine.kv_specs, probes, total,
                                         engine.config.max_num_batched_tokens)
    text_ttft = statistics.median(text_ttfts)
    text_row = row(f"TTFT, text-only {total}-token prompt", text_ttft, roofline, what)
    image_row = row(f"TTFT, {load.per_prompt} image(s) + {text_len} text tokens", statistics.median(image_ttfts),
                    text_ttft, f"baseline: the text-only prompt of {total} tokens above, same run")
    image_row["note"] = (f"{total} tokens ({warm.items[0].num_soft_tokens} soft tokens an image); fresh images "
                         f"each repeat: the tower ran {encoded} times, no encoder-cache hit")
    return [text_row, image_row, encoder_row(engine, probes, load, warm.items)]


def run_image_latency(engine, probes: Probes, load: ImageLoad, input_len: int, output_len: int, batch_size: int,
                      repeats: int, seed: int) -> list[dict]:
    warm_up(engine, batch_size, input_len, seed)
    return [*image_ttft_rows(engine, probes, load, input_len, repeats, seed),
            *tpot_rows(engine, probes, input_len, output_len, batch_size, seed)]


def image_chats(count: int, load: ImageLoad, text_len: int, seed: int) -> list[list[dict]]:
    """`bench serve`'s chats: each a user turn of load.per_prompt PNG data-URL images of seeded random pixels (none
    repeats, so no encoder-cache hit) and text_len random letters."""
    import base64
    import io

    from PIL import Image
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    chats = []
    for _ in range(count):
        parts = []
        for _ in range(load.per_prompt):
            png = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (load.height, load.width, 3), dtype=np.uint8)).save(png, "PNG")
            url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
        parts.append({"type": "text", "text": "".join(rng.choice(letters, text_len))})
        chats.append([{"role": "user", "content": parts}])
    return chats
