"""Media parts of OpenAI chat messages (`image_url`, `input_audio`, and vLLM's `video_url` and `audio_url`): found,
counted against limit_mm_per_prompt, fetched and decoded under the media policy. Shared by the server and
LLM.chat."""
from dataclasses import dataclass

from atomlite.multimodal.media import MediaError, MediaPolicy, load_audio, load_image, load_video

PART_MODALITIES = {"image_url": "image", "video_url": "video", "audio_url": "audio", "input_audio": "audio"}
# input_audio's formats (OpenAI's wav and mp3, and what FFmpeg reads as vLLM takes them)
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "m4a", "aac", "opus", "webm")


@dataclass(frozen=True)
class MediaPart:
    where: str  # the part's place in the request: messages[0].content[1].image_url
    modality: str  # "image" | "video" | "audio"
    url: str  # input_audio's data and format as a data: URL


def media_parts(messages: list[dict]) -> list[MediaPart]:
    """Every media part, in the order the template renders them."""
    parts = []
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in PART_MODALITIES:
                where = f"messages[{i}].content[{j}].{kind}"
                url = _input_audio_url(part.get(kind), where) if kind == "input_audio" else _url(part.get(kind), where)
                parts.append(MediaPart(where, PART_MODALITIES[kind], url))
    return parts


def _url(value, where: str) -> str:
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise MediaError(where, 'give the media as {"url": "..."}')
    return url


def _input_audio_url(value, where: str) -> str:
    data = value.get("data") if isinstance(value, dict) else None
    form = value.get("format") if isinstance(value, dict) else None
    if not isinstance(data, str) or not data:
        raise MediaError(where, 'give the clip as {"data": "<base64>", "format": "wav"}')
    if form not in AUDIO_FORMATS:
        raise MediaError(where, f"format {form!r} is not one of {', '.join(AUDIO_FORMATS)}")
    return f"data:audio/{form};base64,{data}"


def check_media_limits(counts: dict[str, int], limits: dict[str, int]) -> None:
    """A ValueError naming the limit when a prompt has more items of a modality than it allows."""
    for modality, count in counts.items():
        if count > limits.get(modality, 0):
            raise ValueError(f"the prompt has {count} {modality}s, over the limit of {limits.get(modality, 0)} per "
                             f"prompt (limit_mm_per_prompt, --limit-mm-per-prompt)")


def count_modalities(parts: list[MediaPart]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in parts:
        counts[part.modality] = counts.get(part.modality, 0) + 1
    return counts


def load_media(parts: list[MediaPart], policy: MediaPolicy) -> tuple[list, list, list]:
    """(images, videos, clips) of the parts, in order: PIL images, (frames, metadata) per video, and 16 kHz mono
    waveforms."""
    images = [load_image(p.url, policy, p.where) for p in parts if p.modality == "image"]
    videos = [load_video(p.url, policy, p.where) for p in parts if p.modality == "video"]
    clips = [load_audio(p.url, policy, p.where) for p in parts if p.modality == "audio"]
    return images, videos, clips
