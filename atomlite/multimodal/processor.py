"""Gemma 4's multimodal processor: a prompt with image and video placeholders plus the images and videos ->
MultiModalPrompt. Equal to transformers' Gemma4Processor: each image placeholder (<|image|>) becomes
<|image> + N x <|image|> + <image|>, each video placeholder (<|video|>) its frames, "mm:ss <|image> + N x <|video|>
+ <image|>" joined by spaces."""
import json
import re
from dataclasses import dataclass
from pathlib import Path

from atomlite.multimodal.inputs import ImageItem, MultiModalPrompt, placeholder_runs
from atomlite.multimodal.items import image_item, video_frame_items
from atomlite.multimodal.options import parse_mm_processor_kwargs
from atomlite.multimodal.patches import PatchSpec
from atomlite.multimodal.video import sampled_video, timestamp_text

VIDEO_SOFT_TOKENS = 70  # Gemma4VideoProcessor's max_soft_tokens


@dataclass(frozen=True)
class SpecialTokens:
    """The ids of Gemma 4's vision tokens (config.json) and their text (the tokenizer's)."""
    image_id: int
    video_id: int
    boi_id: int
    eoi_id: int
    image: str
    video: str
    boi: str
    eoi: str


def has_vision(model_dir: str | Path) -> bool:
    config = Path(model_dir) / "config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("vision_config"))


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _patch_specs(model_dir: Path, config: dict) -> tuple[PatchSpec, PatchSpec]:
    """Image and video patch settings: processor_config.json's, else preprocessor_config.json's, else the vision
    config's, else Gemma 4's."""
    vision = config.get("vision_config") or {}
    base = {"patch_size": vision.get("patch_size", 16), "pooling_kernel_size": vision.get("pooling_kernel_size", 3),
            "max_soft_tokens": vision.get("default_output_length", 280)}
    processor = _read(model_dir / "processor_config.json")
    image = processor.get("image_processor") or _read(model_dir / "preprocessor_config.json")
    video = processor.get("video_processor") or _read(model_dir / "video_preprocessor_config.json")

    def spec(given: dict, defaults: dict) -> PatchSpec:
        return PatchSpec(**{key: given.get(key, value) for key, value in defaults.items()})
    return spec(image, base), spec(video, {**base, "max_soft_tokens": VIDEO_SOFT_TOKENS})


def image_patch_spec(model_dir: str | Path) -> PatchSpec:
    """The patch settings the checkpoint's processor gives images (no tokenizer needed)."""
    path = Path(model_dir)
    return _patch_specs(path, _read(path / "config.json"))[0]


def _special_tokens(config: dict, tokenizer) -> SpecialTokens:
    ids = {name: config.get(f"{name}_token_id") for name in ("image", "video", "boi", "eoi")}
    missing = [f"{name}_token_id" for name, value in ids.items() if value is None]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}, which a Gemma 4 vision model declares")
    texts = {name: tokenizer.convert_ids_to_tokens(value) for name, value in ids.items()}
    unknown = [f"{name}_token_id {ids[name]}" for name, text in texts.items() if text is None]
    if unknown:
        raise ValueError(f"the tokenizer has no token for {', '.join(unknown)}")
    return SpecialTokens(ids["image"], ids["video"], ids["boi"], ids["eoi"], texts["image"], texts["video"],
                         texts["boi"], texts["eoi"])


class MultiModalProcessor:
    """Expands the placeholders of a prompt and turns its images and videos into ImageItems."""

    def __init__(self, tokenizer, tokens: SpecialTokens, image_spec: PatchSpec = PatchSpec(),
                 video_spec: PatchSpec = PatchSpec(max_soft_tokens=VIDEO_SOFT_TOKENS),
                 mm_processor_kwargs: dict | None = None):
        self.tokenizer, self.tokens = tokenizer, tokens
        self.image_spec, self.video_spec = image_spec, video_spec
        self.default_kwargs = parse_mm_processor_kwargs(mm_processor_kwargs, "--mm-processor-kwargs")
        self._placeholder = re.compile(f"({re.escape(tokens.image)}|{re.escape(tokens.video)})")

    @classmethod
    def from_model_dir(cls, path: str | Path, tokenizer, mm_processor_kwargs: dict | None = None) \
            -> "MultiModalProcessor":
        """The processor of a Gemma 4 vision checkpoint (config.json with a vision_config); a ValueError for a
        checkpoint without one."""
        path = Path(path)
        config = _read(path / "config.json")
        if not config.get("vision_config"):
            raise ValueError(f"the model {path.name} has no vision tower (its config.json has no vision_config): it "
                             f"takes text only")
        image_spec, video_spec = _patch_specs(path, config)
        return cls(tokenizer, _special_tokens(config, tokenizer), image_spec, video_spec, mm_processor_kwargs)

    def process(self, prompt: str | list[int], images: list | tuple = (), videos: list | tuple = (),
                mm_processor_kwargs: dict | None = None, add_special_tokens: bool = True,
                names: tuple[str, str] = ("images", "videos")) -> MultiModalPrompt:
        """prompt: text (tokenized here, with add_special_tokens) or token ids, holding one image placeholder per
        image and one video placeholder per video, in order. mm_processor_kwargs (max_soft_tokens) override the
        checkpoint's and --mm-processor-kwargs'. names: what errors call the images and the videos."""
        kwargs = {**self.default_kwargs, **parse_mm_processor_kwargs(mm_processor_kwargs)}
        spec = PatchSpec(self.image_spec.patch_size, self.image_spec.pooling_kernel_size,
                         kwargs.get("max_soft_tokens", self.image_spec.max_soft_tokens))
        self._check_counts(prompt, len(images), len(videos))
        image_items = [image_item(image, spec, f"{names[0]}[{i}]") for i, image in enumerate(images)]
        frames = [video_frame_items(sampled_video(v, f"{names[1]}[{i}]"), self.video_spec)
                  for i, v in enumerate(videos)]
        if isinstance(prompt, str):
            ids = self._expand_text(prompt, image_items, frames, add_special_tokens)
        else:
            ids = self._expand_ids(list(prompt), image_items, frames)
        return self._with_ranges(ids, image_items, frames)

    def _check_counts(self, prompt: str | list[int], num_images: int, num_videos: int) -> None:
        t = self.tokens
        if isinstance(prompt, str):
            found = prompt.count(t.image), prompt.count(t.video)
        else:
            found = prompt.count(t.image_id), prompt.count(t.video_id)
        for (name, placeholder), in_prompt, given in zip((("image", t.image), ("video", t.video)), found,
                                                         (num_images, num_videos)):
            if in_prompt != given:
                raise ValueError(f"the prompt has {in_prompt} {name} placeholders ({placeholder}) but {given} "
                                 f"{name}s were given: one placeholder per {name}")

    def _image_text(self, item: ImageItem) -> str:
        return f"{self.tokens.boi}{self.tokens.image * item.num_soft_tokens}{self.tokens.eoi}"

    def _video_text(self, frames: list[ImageItem]) -> str:
        t = self.tokens
        return " ".join(f"{timestamp_text(f.timestamp_s)} {t.boi}{t.video * f.num_soft_tokens}{t.eoi}"
                        for f in frames)

    def _expand_text(self, text: str, images: list[ImageItem], videos: list[list[ImageItem]],
                     add_special_tokens: bool) -> list[int]:
        pieces, next_image, next_video = self._placeholder.split(text), iter(images), iter(videos)
        for i in range(1, len(pieces), 2):
            is_image = pieces[i] == self.tokens.image
            pieces[i] = self._image_text(next(next_image)) if is_image else self._video_text(next(next_video))
        return self.tokenizer.encode("".join(pieces), add_special_tokens=add_special_tokens)

    def _expand_ids(self, ids: list[int], images: list[ImageItem], videos: list[list[ImageItem]]) -> list[int]:
        t, out, next_image, next_video = self.tokens, [], iter(images), iter(videos)
        for token in ids:
            if token == t.image_id:
                out += [t.boi_id] + [t.image_id] * next(next_image).num_soft_tokens + [t.eoi_id]
            elif token == t.video_id:
                for k, frame in enumerate(next(next_video)):
                    stamp = timestamp_text(frame.timestamp_s)
                    out += self.tokenizer.encode(f" {stamp} " if k else f"{stamp} ", add_special_tokens=False)
                    out += [t.boi_id] + [t.video_id] * frame.num_soft_tokens + [t.eoi_id]
            else:
                out.append(token)
        return out

    def _with_ranges(self, ids: list[int], images: list[ImageItem], videos: list[list[ImageItem]]) \
            -> MultiModalPrompt:
        """Items in prompt order, each matched to its run of placeholder tokens in the ids."""
        runs = placeholder_runs(ids, {self.tokens.image_id, self.tokens.video_id})
        next_image, next_frame = iter(images), iter([f for frames in videos for f in frames])
        items = [next(next_image, None) if ids[offset] == self.tokens.image_id else next(next_frame, None)
                 for offset, _ in runs[:len(images) + sum(map(len, videos))]]
        if len(runs) != len(items) or any(item is None or item.num_soft_tokens != length
                                          for item, (_, length) in zip(items, runs)):
            raise ValueError("the prompt's image or video tokens do not match its placeholders: write image and "
                             "video tokens only as one placeholder per item")
        return MultiModalPrompt(ids, items, runs)
