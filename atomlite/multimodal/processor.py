"""Gemma 4's multimodal processor: a prompt with image, video and audio placeholders plus the images, videos and
clips -> MultiModalPrompt. Equal to transformers' Gemma4Processor: each image placeholder (<|image|>) becomes
<|image> + N x <|image|> + <image|>, each video placeholder (<|video|>) its frames, "mm:ss <|image> + N x <|video|>
+ <image|>" joined by spaces, each audio placeholder (<|audio|>) <|audio> + N x <|audio|> + <audio|>."""
import json
import re
from dataclasses import dataclass
from pathlib import Path

from atomlite.multimodal.inputs import AudioItem, ImageItem, MultiModalPrompt, placeholder_runs
from atomlite.multimodal.items import image_item, video_frame_items
from atomlite.multimodal.options import parse_mm_processor_kwargs
from atomlite.multimodal.patches import PatchSpec
from atomlite.multimodal.video import sampled_video, timestamp_text

VIDEO_SOFT_TOKENS = 70  # Gemma4VideoProcessor's max_soft_tokens


@dataclass(frozen=True)
class SpecialTokens:
    """The ids of Gemma 4's vision (and audio) tokens (config.json) and their text (the tokenizer's); the audio ones
    None for a checkpoint without an audio tower, the vision ones None for one without a vision tower."""
    image_id: int | None = None
    video_id: int | None = None
    boi_id: int | None = None
    eoi_id: int | None = None
    image: str | None = None
    video: str | None = None
    boi: str | None = None
    eoi: str | None = None
    audio_id: int | None = None
    boa_id: int | None = None
    eoa_id: int | None = None
    audio: str | None = None
    boa: str | None = None
    eoa: str | None = None

    @property
    def placeholders(self) -> dict[str, tuple[str, int]]:
        """modality -> (placeholder text, id), for the modalities the checkpoint has a tower for."""
        given = {"image": (self.image, self.image_id), "video": (self.video, self.video_id),
                 "audio": (self.audio, self.audio_id)}
        return {modality: pair for modality, pair in given.items() if pair[1] is not None}


def towers_of(model_dir: str | Path) -> set[str]:
    """The modalities a checkpoint's towers take: image and video with a vision_config, audio with an
    audio_config."""
    config = _read(Path(model_dir) / "config.json")
    return ({"image", "video"} if config.get("vision_config") else set()) | \
        ({"audio"} if config.get("audio_config") else set())


def has_vision(model_dir: str | Path) -> bool:
    return "image" in towers_of(model_dir)


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


VISION_KEYS = {"image": "image_token_id", "video": "video_token_id", "boi": "boi_token_id", "eoi": "eoi_token_id"}
# transformers' Gemma4Config names the end-of-audio id eoa_token_index
AUDIO_KEYS = {"audio": "audio_token_id", "boa": "boa_token_id", "eoa": "eoa_token_index"}


def _token_group(config: dict, tokenizer, keys: dict[str, str], tower: str) -> dict[str, tuple[int, str]]:
    ids = {name: config.get(key) for name, key in keys.items()}
    missing = [keys[name] for name, value in ids.items() if value is None]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}, which a Gemma 4 {tower} model declares")
    texts = {name: tokenizer.convert_ids_to_tokens(value) for name, value in ids.items()}
    unknown = [f"{keys[name]} {ids[name]}" for name, text in texts.items() if text is None]
    if unknown:
        raise ValueError(f"the tokenizer has no token for {', '.join(unknown)}")
    return {name: (ids[name], texts[name]) for name in keys}


def _special_tokens(config: dict, tokenizer) -> SpecialTokens:
    given = {}
    if config.get("vision_config"):
        given.update(_token_group(config, tokenizer, VISION_KEYS, "vision"))
    if config.get("audio_config"):
        given.update(_token_group(config, tokenizer, AUDIO_KEYS, "audio"))
    fields = {}
    for name, (token_id, text) in given.items():
        fields[f"{name}_id"], fields[name] = token_id, text
    return SpecialTokens(**fields)


class MultiModalProcessor:
    """Expands the placeholders of a prompt and turns its images and videos into ImageItems, its clips (16 kHz
    waveforms) into AudioItems."""

    def __init__(self, tokenizer, tokens: SpecialTokens, image_spec: PatchSpec = PatchSpec(),
                 video_spec: PatchSpec = PatchSpec(max_soft_tokens=VIDEO_SOFT_TOKENS),
                 mm_processor_kwargs: dict | None = None, audio_features=None):
        self.tokenizer, self.tokens = tokenizer, tokens
        self.image_spec, self.video_spec = image_spec, video_spec
        self.audio_features = audio_features  # multimodal.audio.AudioFeatures, for a checkpoint with an audio tower
        self.default_kwargs = parse_mm_processor_kwargs(mm_processor_kwargs, "--mm-processor-kwargs")
        texts = [text for text, _ in tokens.placeholders.values()]
        self._placeholder = re.compile("(" + "|".join(map(re.escape, texts)) + ")")

    @property
    def modalities(self) -> set[str]:
        """What the checkpoint's towers take."""
        return set(self.tokens.placeholders)

    @classmethod
    def from_model_dir(cls, path: str | Path, tokenizer, mm_processor_kwargs: dict | None = None) \
            -> "MultiModalProcessor":
        """The processor of a Gemma 4 checkpoint with a vision or an audio tower (config.json with a vision_config or
        an audio_config); a ValueError for a checkpoint without either."""
        path = Path(path)
        config = _read(path / "config.json")
        if not towers_of(path):
            raise ValueError(f"the model {path.name} has no vision tower and no audio tower (its config.json has "
                             f"neither a vision_config nor an audio_config): it takes text only")
        image_spec, video_spec = _patch_specs(path, config)
        audio = None
        if config.get("audio_config"):
            from atomlite.multimodal.audio import AudioFeatures
            audio = AudioFeatures(path)
        return cls(tokenizer, _special_tokens(config, tokenizer), image_spec, video_spec, mm_processor_kwargs, audio)

    def process(self, prompt: str | list[int], images: list | tuple = (), videos: list | tuple = (),
                mm_processor_kwargs: dict | None = None, add_special_tokens: bool = True,
                names: tuple[str, ...] = ("images", "videos", "audios"), audios: list | tuple = ()) \
            -> MultiModalPrompt:
        """prompt: text (tokenized here, with add_special_tokens) or token ids, holding one placeholder per image,
        video and audio clip (a 16 kHz mono waveform), in order. mm_processor_kwargs (max_soft_tokens) override the
        checkpoint's and --mm-processor-kwargs'. names: what errors call the images, the videos and the clips."""
        kwargs = {**self.default_kwargs, **parse_mm_processor_kwargs(mm_processor_kwargs)}
        spec = PatchSpec(self.image_spec.patch_size, self.image_spec.pooling_kernel_size,
                         kwargs.get("max_soft_tokens", self.image_spec.max_soft_tokens))
        self._check_counts(prompt, {"image": len(images), "video": len(videos), "audio": len(audios)})
        image_items = [image_item(image, spec, f"{names[0]}[{i}]") for i, image in enumerate(images)]
        frames = [video_frame_items(sampled_video(v, f"{names[1]}[{i}]"), self.video_spec)
                  for i, v in enumerate(videos)]
        clips = [self.audio_features.item(clip, f"{names[2]}[{i}]") for i, clip in enumerate(audios)]
        if isinstance(prompt, str):
            ids = self._expand_text(prompt, image_items, frames, clips, add_special_tokens)
        else:
            ids = self._expand_ids(list(prompt), image_items, frames, clips)
        return self._with_ranges(ids, image_items, frames, clips)

    def _check_counts(self, prompt: str | list[int], given: dict[str, int]) -> None:
        placeholders = self.tokens.placeholders
        for name, count in given.items():
            if name not in placeholders:
                if count:
                    raise ValueError(f"{count} {name}s were given but the model has no tower for them")
                continue
            text, token_id = placeholders[name]
            in_prompt = prompt.count(text) if isinstance(prompt, str) else prompt.count(token_id)
            if in_prompt != count:
                raise ValueError(f"the prompt has {in_prompt} {name} placeholders ({text}) but {count} "
                                 f"{name}s were given: one placeholder per {name}")

    def _image_text(self, item: ImageItem) -> str:
        return f"{self.tokens.boi}{self.tokens.image * item.num_soft_tokens}{self.tokens.eoi}"

    def _audio_text(self, clip: AudioItem) -> str:
        return f"{self.tokens.boa}{self.tokens.audio * clip.num_soft_tokens}{self.tokens.eoa}"

    def _video_text(self, frames: list[ImageItem]) -> str:
        t = self.tokens
        return " ".join(f"{timestamp_text(f.timestamp_s)} {t.boi}{t.video * f.num_soft_tokens}{t.eoi}"
                        for f in frames)

    def _expand_text(self, text: str, images: list[ImageItem], videos: list[list[ImageItem]], clips: list[AudioItem],
                     add_special_tokens: bool) -> list[int]:
        pieces = self._placeholder.split(text)
        next_image, next_video, next_clip = iter(images), iter(videos), iter(clips)
        for i in range(1, len(pieces), 2):
            if pieces[i] == self.tokens.image:
                pieces[i] = self._image_text(next(next_image))
            elif pieces[i] == self.tokens.audio:
                pieces[i] = self._audio_text(next(next_clip))
            else:
                pieces[i] = self._video_text(next(next_video))
        return self.tokenizer.encode("".join(pieces), add_special_tokens=add_special_tokens)

    def _expand_ids(self, ids: list[int], images: list[ImageItem], videos: list[list[ImageItem]],
                    clips: list[AudioItem]) -> list[int]:
        t, out, next_image, next_video, next_clip = self.tokens, [], iter(images), iter(videos), iter(clips)
        for token in ids:
            if token == t.image_id:
                out += [t.boi_id] + [t.image_id] * next(next_image).num_soft_tokens + [t.eoi_id]
            elif token == t.audio_id:
                out += [t.boa_id] + [t.audio_id] * next(next_clip).num_soft_tokens + [t.eoa_id]
            elif token == t.video_id:
                for k, frame in enumerate(next(next_video)):
                    stamp = timestamp_text(frame.timestamp_s)
                    out += self.tokenizer.encode(f" {stamp} " if k else f"{stamp} ", add_special_tokens=False)
                    out += [t.boi_id] + [t.video_id] * frame.num_soft_tokens + [t.eoi_id]
            else:
                out.append(token)
        return out

    def _with_ranges(self, ids: list[int], images: list[ImageItem], videos: list[list[ImageItem]],
                     clips: list[AudioItem]) -> MultiModalPrompt:
        """Items in prompt order, each matched to its run of placeholder tokens in the ids."""
        t = self.tokens
        runs = placeholder_runs(ids, {token_id for _, token_id in t.placeholders.values()})
        queues = {t.image_id: iter(images), t.video_id: iter([f for frames in videos for f in frames]),
                  t.audio_id: iter(clips)}
        items = [next(queues[ids[offset]], None) for offset, _ in runs[:len(images) + sum(map(len, videos))
                                                                        + len(clips)]]
        if len(runs) != len(items) or any(item is None or item.num_soft_tokens != length
                                          for item, (_, length) in zip(items, runs)):
            raise ValueError("the prompt's image, video or audio tokens do not match its placeholders: write them "
                             "only as one placeholder per item")
        return MultiModalPrompt(ids, items, runs)
