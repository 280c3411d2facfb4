"""Image and video parts of OpenAI chat messages (`image_url`, and vLLM's `video_url`): found, counted against
limit_mm_per_prompt, fetched and decoded under the media policy. Shared by the server and LLM.chat."""
from dataclasses import dataclass

from atomlite.multimodal.media import MediaError, MediaPolicy, load_image, load_video

PART_MODALITIES = {"image_url": "image", "video_url": "video"}


@dataclass(frozen=True)
class MediaPart:
    where: str  # the part's place in the request: messages[0].content[1].image_url
    modality: str  # "image" | "video"
    url: str


def media_parts(messages: list[dict]) -> list[MediaPart]:
    """Every image_url / video_url part, in the order the template renders them."""
    parts = []
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in PART_MODALITIES:
                where = f"messages[{i}].content[{j}].{kind}"
                value = part.get(kind)
                url = value.get("url") if isinstance(value, dict) else value
                if not isinstance(url, str) or not url:
                    raise MediaError(where, 'give the media as {"url": "..."}')
                parts.append(MediaPart(where, PART_MODALITIES[kind], url))
    return parts


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


def load_media(parts: list[MediaPart], policy: MediaPolicy) -> tuple[list, list]:
    """(images, videos) of the parts, in order: PIL images, and (frames, metadata) per video."""
    images = [load_image(p.url, policy, p.where) for p in parts if p.modality == "image"]
    videos = [load_video(p.url, policy, p.where) for p in parts if p.modality == "video"]
    return images, videos
