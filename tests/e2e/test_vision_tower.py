"""Gemma 4's vision tower and projector against transformers' own, float32, on tiny random towers of both real
shapes (31B/26B-A4B: standardized; E2B/E4B: clipped linears): the soft tokens of images the Gemma 4 image processor
made, at every soft-token budget; a whole forward with images in the prompt (causal text attention); loading every
tower tensor of a transformers checkpoint, and dummy weights for the tower."""
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import Gemma4TextConfig, Gemma4VisionConfig
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

import tiny_models
from atomlite import LLM, SamplingParams
from atomlite.config import EngineConfig, load_model_spec
from atomlite.engine.sequence import Sequence
from atomlite.engine.runner.step_inputs import StepInputBuilder
from atomlite.errors import ConfigError
from atomlite.loader import resolve
from atomlite.model_ops.linear_builder import LinearBuilder
from atomlite.model_ops.multimodal import MultiModalEmbeds
from atomlite.model_ops.platform import Platform
from atomlite.models.gemma4 import Gemma4ForCausalLM
from atomlite.models.gemma4_vision import Gemma4VisionTower
from atomlite.plan import meta_model

SHAPES = list(tiny_models.VISION)
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)
ASPECTS = {"landscape": (64, 48), "tall": (30, 90)}  # (width, height) of the source image
TOKENS = tiny_models.MULTIMODAL_TOKENS
TEXT = [5, 17, 33, 8]  # prompt text; tokens 89..95 are the special ones


def random_image(aspect: str, seed: int = 0) -> Image.Image:
    width, height = ASPECTS[aspect]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def processed(images: list[Image.Image], max_soft_tokens: int = 70) -> dict:
    return Gemma4ImageProcessorPil(max_soft_tokens=max_soft_tokens)(images=images, return_tensors="pt")


@pytest.fixture(scope="module")
def towers(checkpoints):
    """Tower shape -> (atomlite LLM, transformers model), over a dense text model."""
    built = {}
    for shape in SHAPES:
        path, ref = checkpoints.get("dense", vision=shape)
        built[shape] = (LLM(str(path), dtype="float32", device="cpu", enable_prefix_caching=False), ref)
    return built


def transformers_soft_tokens(ref, batch: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(ref.model.get_image_features(batch["pixel_values"], batch["image_position_ids"]).pooler_output)


@pytest.mark.parametrize("max_soft_tokens", SOFT_TOKEN_BUDGETS)
@pytest.mark.parametrize("aspect", list(ASPECTS))
@pytest.mark.parametrize("shape", SHAPES)
def test_soft_tokens_of_one_image_match_transformers(towers, shape, aspect, max_soft_tokens):
    llm, ref = towers[shape]
    batch = processed([random_image(aspect)], max_soft_tokens)
    expected = transformers_soft_tokens(ref, batch)[0]
    with torch.inference_mode():
        mine = llm.engine.model.vision(batch["pixel_values"][0], batch["image_position_ids"][0])
    assert mine.shape == expected.shape == (int(batch["num_soft_tokens_per_image"][0]), tiny_models.BASE["hidden_size"])
    torch.testing.assert_close(mine, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_images_encoded_together_match_transformers_batch(towers, shape):
    """Packed in one pass, images of different patch counts never see each other."""
    llm, ref = towers[shape]
    batch = processed([random_image("landscape", 1), random_image("tall", 2), random_image("landscape", 3)], 140)
    expected = transformers_soft_tokens(ref, batch)
    with torch.inference_mode():
        mine = llm.engine.model.embed_images(batch["pixel_values"], batch["image_position_ids"])
    assert [t.shape[0] for t in mine] == batch["num_soft_tokens_per_image"].tolist()
    for got, want in zip(mine, expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_a_videos_soft_tokens_are_its_frames_in_order(towers):
    """transformers' get_video_features runs the same tower over each frame: a video is its frames' images."""
    llm, ref = towers["clipped"]
    frames = processed([random_image("landscape", 4), random_image("landscape", 5)])
    with torch.no_grad():
        video = ref.model.get_video_features(frames["pixel_values"], frames["image_position_ids"],
                                             num_frames_per_video=torch.tensor([2])).pooler_output[0]
    with torch.inference_mode():
        mine = llm.engine.model.embed_images(frames["pixel_values"], frames["image_position_ids"])
    torch.testing.assert_close(torch.cat(mine), video, atol=1e-4, rtol=0)


def test_patches_that_do_not_pool_into_whole_squares_are_refused(towers):
    llm, _ = towers["clipped"]
    batch = processed([random_image("landscape")])
    positions = batch["image_position_ids"][0].clone()
    positions[0] = -1  # one real patch fewer: 8 left in its square
    with pytest.raises(ValueError, match="whole 3x3 squares"):
        llm.engine.model.vision(batch["pixel_values"][0], positions)


def image_prompt(soft_tokens: list[int]) -> list[int]:
    """Text, then each image as boi, its soft tokens' placeholders, eoi, then text again."""
    ids = list(TEXT)
    for count in soft_tokens:
        ids += [TOKENS["boi_token_id"]] + [TOKENS["image_token_id"]] * count + [TOKENS["eoi_token_id"]] + [7, 11]
    return ids


@torch.inference_mode()
def atomlite_logprobs(llm: LLM, ids: list[int], batch: dict, chunks: list[int]) -> torch.Tensor:
    """[len(ids), vocab] log-probs of one prompt prefilled in chunks of the given sizes, each chunk's image rows
    given their soft tokens."""
    model, kv = llm.engine.model, llm.engine.kv
    soft = torch.cat(model.embed_images(batch["pixel_values"], batch["image_position_ids"]))
    image_rows = [i for i, token in enumerate(ids) if token == model.vision_spec.image_token_id]
    seq, builder, rows = Sequence(ids, SamplingParams()), StepInputBuilder(kv, torch.device("cpu"), {}), []
    start = 0
    for size in chunks:
        assert kv.allocate(seq, size)
        step_ids, ctx = builder.context(builder.build([(seq, size)]))
        in_chunk = [i for i, row in enumerate(image_rows) if start <= row < start + size]
        embeds = MultiModalEmbeds(torch.tensor([image_rows[i] - start for i in in_chunk]), soft[in_chunk])
        rows.append(model.compute_logits(model(step_ids, ctx, embeds if in_chunk else None)))
        seq.num_computed_tokens = start = start + size
    kv.free(seq)
    return torch.log_softmax(torch.cat(rows).float(), dim=-1)


def transformers_logprobs(ref, ids: list[int], batch: dict, soft_tokens: list[torch.Tensor] | None = None):
    """[len(ids), vocab]; soft_tokens: the images' soft tokens given to transformers in place of its own tower's."""
    given = None if soft_tokens is None else {"image": BaseModelOutputWithPooling(pooler_output=tuple(soft_tokens))}
    pixels = {} if given else dict(pixel_values=batch["pixel_values"], image_position_ids=batch["image_position_ids"])
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor([ids]), mm_encoder_outputs=given, **pixels).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


PROMPTS = [("dense", "standardized", ["landscape"]), ("dense", "standardized", ["landscape", "tall"]),
           ("dense", "clipped", ["tall", "landscape"]), ("ple", "clipped", ["landscape"]),
           ("ple", "clipped", ["tall", "landscape"])]


def image_case(checkpoints, variant: str, shape: str, aspects: list[str]):
    """(atomlite LLM, transformers model, processed images, prompt ids) with causal text attention (the tiny text
    configs set no use_bidirectional_attention)."""
    path, ref = checkpoints.get(variant, vision=shape)
    llm = LLM(str(path), dtype="float32", device="cpu", enable_prefix_caching=False)
    batch = processed([random_image(aspect, seed) for seed, aspect in enumerate(aspects)])
    return llm, ref, batch, image_prompt(batch["num_soft_tokens_per_image"].tolist())


@pytest.mark.parametrize("variant,shape,aspects", PROMPTS)
def test_soft_tokens_in_a_prompt_give_transformers_logits_at_every_position(checkpoints, variant, shape, aspects):
    """The text side alone, both given the same soft tokens: they replace the image rows' embeddings unscaled, and PLE
    models read the pad token's per-layer embedding there."""
    llm, ref, batch, ids = image_case(checkpoints, variant, shape, aspects)
    with torch.inference_mode():
        soft = llm.engine.model.embed_images(batch["pixel_values"], batch["image_position_ids"])
    expected = transformers_logprobs(ref, ids, batch, soft)
    torch.testing.assert_close(atomlite_logprobs(llm, ids, batch, [len(ids)]), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant,shape,aspects", PROMPTS)
def test_images_in_a_prompt_give_transformers_logits_at_every_position(checkpoints, variant, shape, aspects):
    """End to end, each side's own tower. Their soft tokens differ by ~2e-6 (transformers' SDPA masks the padding
    patches, a kernel that rounds differently), which the random decoder amplifies to ~2e-4 over the prompt; a text
    side error moves them by far more (the test above holds it to 1e-5)."""
    llm, ref, batch, ids = image_case(checkpoints, variant, shape, aspects)
    expected = transformers_logprobs(ref, ids, batch)
    torch.testing.assert_close(atomlite_logprobs(llm, ids, batch, [len(ids)]), expected, atol=1e-3, rtol=0)


def test_an_image_split_across_prefill_chunks_gives_transformers_logits(checkpoints):
    llm, ref, batch, ids = image_case(checkpoints, "ple", "clipped", ["landscape"])
    chunks = [len(TEXT) + 20, 30, len(ids) - len(TEXT) - 50]  # the image's rows in all three
    with torch.inference_mode():
        soft = llm.engine.model.embed_images(batch["pixel_values"], batch["image_position_ids"])
    expected = transformers_logprobs(ref, ids, batch, soft)
    torch.testing.assert_close(atomlite_logprobs(llm, ids, batch, chunks), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_tower_tensor_of_a_transformers_checkpoint_is_loaded(checkpoints, shape):
    path, _ = checkpoints.get("dense", vision=shape)
    model = LLM(str(path), dtype="float32", device="cpu").engine.model
    names = [n for n in load_file(path / "model.safetensors") if n.startswith(("model.vision_tower.",
                                                                                "model.embed_vision."))]
    resolved = {resolve(model, name) for name in names}  # (parameter, shard): q/k/v and gate/up fused where unclipped
    targets = {target for target, _ in resolved}
    assert targets == {f"vision.{name}" for name, _ in model.vision.named_parameters()}
    assert all(target.startswith("vision.") for target in targets) and len(resolved) == len(names)


@pytest.mark.parametrize("change", ["extra", "missing"])
def test_a_tower_tensor_too_many_or_too_few_is_an_error(checkpoints, tmp_path, change):
    path, _ = checkpoints.get("dense", vision="clipped")
    out = tmp_path / change
    out.mkdir()
    (out / "config.json").write_text((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    clip = "model.vision_tower.encoder.layers.1.mlp.down_proj.input_max"
    if change == "extra":
        tensors["model.vision_tower.encoder.layers.1.mlp.down_proj.linear.bias"] = torch.zeros(32)
    else:
        del tensors[clip]
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(ConfigError, match="linear.bias" if change == "extra" else "down_proj.input_max"):
        LLM(str(out), dtype="float32", device="cpu")


def test_text_only_and_towerless_checkpoints_have_no_vision(checkpoints):
    for path in (checkpoints.get("dense")[0], checkpoints.get("dense", multimodal=True)[0]):
        assert load_model_spec(path).vision is None
    spec = load_model_spec(checkpoints.get("ple", vision="clipped")[0])
    assert (spec.vision.image_token_id, spec.vision.video_token_id, spec.vision.boi_token_id,
            spec.vision.eoi_token_id, spec.vision.pad_token_id) == (90, 91, 92, 93, 0)
    assert spec.vision.use_bidirectional_attention is None and spec.vision.hf["use_clipped_linears"]


def test_dummy_weights_fill_the_tower_and_clip_nothing(checkpoints):
    path, _ = checkpoints.get("dense", vision="clipped")
    model = LLM(str(path), dtype="float32", device="cpu", load_format="dummy").engine.model
    clip = model.vision.encoder.layers[0].mlp.up_proj
    assert (clip.input_min.item(), clip.output_max.item()) == (-float("inf"), float("inf"))
    batch = processed([random_image("tall")])
    with torch.inference_mode():
        soft = model.embed_images(batch["pixel_values"], batch["image_position_ids"])[0]
    assert soft.shape[0] == int(batch["num_soft_tokens_per_image"][0]) and torch.isfinite(soft).all()


def test_every_tensor_parallel_rank_builds_the_whole_tower(checkpoints):
    config = EngineConfig(model=str(checkpoints.get("dense", vision="standardized")[0]), dtype="float32",
                          tensor_parallel_size=2, device="cpu")
    alone = {n: p.shape for n, p in meta_model(EngineConfig(model=config.model, dtype="float32"), Platform())
             .vision.named_parameters()}
    for rank in (0, 1):
        shards = {n: p.shape for n, p in meta_model(config, Platform(), rank=rank).vision.named_parameters()}
        assert shards == alone


# The real towers' sizes (31B/26B-A4B, E2B/E4B), built on the meta device
REAL_TOWERS = {
    "31B": dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                num_key_value_heads=16, head_dim=72, standardize=True),
    "E2B": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=12,
                num_key_value_heads=12, head_dim=64, use_clipped_linears=True),
}


def checkpoint_name(name: str) -> str:
    """A tower parameter's name -> the checkpoint's (Gemma4ForCausalLM.checkpoint_aliases, read backwards)."""
    for checkpoint, ours in Gemma4ForCausalLM.checkpoint_aliases[::-1]:
        if f"vision.{name}".startswith(ours):
            return checkpoint + f"vision.{name}"[len(ours):]
    raise AssertionError(name)


def packed(tensors: dict, ours: set[str]) -> dict:
    """Checkpoint tensors -> their shapes once the ones a fused parameter of ours holds are stacked into it
    (Gemma4ForCausalLM.packed_weights: the unclipped tower's q/k/v and gate/up)."""
    stacked = {}
    for name, shape in tensors.items():
        for fragment, (fused, _) in Gemma4ForCausalLM.packed_weights.items():
            if f".{fragment}." in name and name.replace(f".{fragment}.", f".{fused}.") in ours:
                name = name.replace(f".{fragment}.", f".{fused}.")
                shape = torch.Size([stacked[name][0] + shape[0], *shape[1:]]) if name in stacked else shape
        stacked[name] = shape
    return stacked


@pytest.mark.parametrize("tower", list(REAL_TOWERS))
def test_real_tower_sizes_hold_transformers_tensors_one_for_one(tower):
    with torch.device("meta"):
        config = Gemma4VisionConfig(**REAL_TOWERS[tower])
        tensors = {f"model.vision_tower.{n}": t.shape for n, t in Gemma4VisionModel(config).state_dict().items()}
        projector = Gemma4MultimodalEmbedder(config, Gemma4TextConfig(hidden_size=5376)).state_dict()
        tensors |= {f"model.embed_vision.{n}": t.shape for n, t in projector.items()}
        mine = Gemma4VisionTower(config.to_dict(), 5376, LinearBuilder({}))
    ours = {checkpoint_name(n): p.shape for n, p in mine.named_parameters()}
    assert ours == packed(tensors, set(ours))
    assert (len(ours) < len(tensors)) == (not REAL_TOWERS[tower].get("use_clipped_linears"))
