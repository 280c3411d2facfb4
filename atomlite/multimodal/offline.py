"""The offline API's multimodal inputs, in vLLM's shapes: a prompt dict {"prompt" | "prompt_token_ids",
"multi_modal_data": {"image": ..., "video": ..., "audio": (samples, sample_rate) or a list of them},
"mm_processor_kwargs"}, and LLM.chat's image_url / video_url / input_audio / audio_url parts, under the engine
config's limits and media policy."""
import numpy as np

from atomlite.chat_template import render_chat_text
from atomlite.chat_text import OPEN
from atomlite.multimodal.audio import waveform
from atomlite.multimodal.chat_media import check_media_limits, count_modalities, load_media, media_parts
from atomlite.multimodal.inputs import MultiModalPrompt
from atomlite.multimodal.media import MediaPolicy
from atomlite.multimodal.processor import MultiModalProcessor, towers_of

PROMPT_KEYS = {"prompt", "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs"}


def _one_or_many_images(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _is_video(item) -> bool:
    return isinstance(item, (list, tuple)) or (isinstance(item, np.ndarray) and item.ndim == 4)


def _clips(value) -> list:
    """One clip (samples, sample_rate) or a list of them."""
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], tuple):
        return [value]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _videos(value) -> list:
    """One video (a [T, H, W, 3] array, a list of frames, or (frames, metadata)) or a list of videos."""
    if isinstance(value, list) and value and _is_video(value[0]):
        return list(value)
    return [value]


class OfflineMultiModal:
    def __init__(self, config, tokenizer):
        self.config, self.tokenizer = config, tokenizer
        self.policy = MediaPolicy(config.allowed_local_media_path, tuple(config.allowed_media_domains))
        self._processor = None

    @property
    def processor(self) -> MultiModalProcessor:
        if self.tokenizer is None:
            raise ValueError("images, videos and audio need the model's tokenizer, and this model has none")
        if self._processor is None:
            self._processor = MultiModalProcessor.from_model_dir(self.config.model_spec.path, self.tokenizer,
                                                                 self.config.mm_processor_kwargs)
        return self._processor

    def prompt_dict(self, prompt: dict) -> tuple[str | list[int], MultiModalPrompt | None]:
        """(the text or token ids, and the MultiModalPrompt when multi_modal_data is given)."""
        unknown = set(prompt) - PROMPT_KEYS
        if unknown:
            raise ValueError(f"prompt key {sorted(unknown)[0]!r} is not one of {', '.join(sorted(PROMPT_KEYS))}")
        if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
            raise ValueError("a prompt dict gives exactly one of prompt or prompt_token_ids")
        text_or_ids = prompt["prompt"] if "prompt" in prompt else list(prompt["prompt_token_ids"])
        data = prompt.get("multi_modal_data")
        if not data:
            return text_or_ids, None
        unknown = set(data) - {"image", "video", "audio"}
        if unknown:
            raise ValueError(f"multi_modal_data.{sorted(unknown)[0]}: atomlite takes image, video and audio")
        images = _one_or_many_images(data["image"]) if "image" in data else []
        videos = _videos(data["video"]) if "video" in data else []
        clips = _clips(data["audio"]) if "audio" in data else []
        check_media_limits({"image": len(images), "video": len(videos), "audio": len(clips)},
                           self.config.limit_mm_per_prompt)
        self._check_towers({"image": len(images), "video": len(videos), "audio": len(clips)}, "multi_modal_data.")
        audios = [waveform(clip, f"multi_modal_data.audio[{i}]") for i, clip in enumerate(clips)]
        processed = self.processor.process(text_or_ids, images, videos, prompt.get("mm_processor_kwargs"),
                                           names=("multi_modal_data.image", "multi_modal_data.video",
                                                  "multi_modal_data.audio"), audios=audios)
        return text_or_ids, processed

    def _check_towers(self, counts: dict[str, int], where: str) -> None:
        """Items of a modality the model has no tower for are refused, naming the model."""
        lacking = [m for m, n in counts.items() if n and m not in towers_of(self.config.model_spec.path)]
        if lacking:
            tower = "audio" if lacking[0] == "audio" else "vision"
            name = self.config.model_spec.path.name
            raise ValueError(f"{where}{lacking[0]}: the model {name} has no {tower} tower (its config.json has no "
                             f"{tower}_config)")

    def chat(self, messages: list[dict], tools: list[dict] | None, chat_template: str | None,
             template_kwargs: dict | None, add_generation_prompt: bool, guard=None) -> MultiModalPrompt | None:
        """The conversation's MultiModalPrompt, or None when it has no image, video or audio part. guard: the
        ContentGuard that marked the messages' strings (its ids then replace the text where marks are)."""
        parts = media_parts(messages)
        if not parts:
            return None
        counts = count_modalities(parts)
        check_media_limits(counts, self.config.limit_mm_per_prompt)
        self._check_towers(counts, "messages: ")
        processor = self.processor
        template = chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError("the model's tokenizer has no chat template: pass chat_template")
        text = render_chat_text(self.tokenizer, messages, tools, template, template_kwargs, add_generation_prompt)
        images, videos, audios = load_media(parts, self.policy)
        prompt = guard.encode(text) if guard is not None and OPEN in text else text
        return processor.process(prompt, images, videos, add_special_tokens=False, audios=audios)
