"""The server's side of images, video and audio: whether the model takes them, the operator's limits and media policy,
and the fetching, decoding and processing, which run in a thread pool beside the event loop.

A thread pool rather than the body-parsing process: Pillow's decoders and resize, PyAV, numpy's copies, hashlib
and socket reads all release the GIL, so the loop keeps answering while they run, and the pixel tensors they
produce stay in this process instead of being pickled back from another (a 1120-token image is 31 MB of
float32)."""
import asyncio
import concurrent.futures

from atomlite.multimodal.chat_media import MediaPart, check_media_limits, count_modalities, load_media, media_parts
from atomlite.multimodal.inputs import MultiModalPrompt
from atomlite.multimodal.media import MediaError, MediaPolicy
from atomlite.multimodal.options import parse_mm_processor_kwargs
from atomlite.multimodal.processor import MultiModalProcessor, towers_of
from atomlite.server.errors import APIError

MEDIA_THREADS = 4


class MultiModalInputs:
    def __init__(self, config, tokenizer, model_name: str):
        self.model_name = model_name
        self.limits = config.limit_mm_per_prompt
        self.policy = MediaPolicy(config.allowed_local_media_path, tuple(config.allowed_media_domains))
        path = config.model_spec.path
        self.processor = None
        self.modalities = towers_of(path) if tokenizer is not None else set()  # a limit of 0 refuses the rest
        if self.modalities:
            self.processor = MultiModalProcessor.from_model_dir(path, tokenizer, config.mm_processor_kwargs)
        self.pool = concurrent.futures.ThreadPoolExecutor(MEDIA_THREADS, thread_name_prefix="atomlite-media")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def check_kwargs(self, kwargs: dict | None) -> None:
        try:
            parse_mm_processor_kwargs(kwargs)
        except ValueError as e:
            raise APIError(400, str(e), "mm_processor_kwargs") from None

    def parts(self, messages: list[dict]) -> list[MediaPart]:
        """The request's media parts, checked against the model and --limit-mm-per-prompt."""
        try:
            parts = media_parts(messages)
            check_media_limits(count_modalities(parts), self.limits)
            for part in parts:
                self.check_modality(part.modality, part.where)
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        return parts

    def check_modality(self, modality: str, where: str) -> None:
        """A MediaError naming the model when it has no tower for the modality."""
        if modality in self.modalities:
            return
        if not self.modalities:
            raise MediaError(where, f"the model {self.model_name} is a text-only model (its config.json has no "
                                    f"{'audio' if modality == 'audio' else 'vision'}_config): send text parts")
        if modality == "audio":
            raise MediaError(where, f"the model {self.model_name} takes no audio (its config.json has no "
                                    f"audio_config)")
        raise MediaError(where, f"the model {self.model_name} takes no images or video (its config.json has no "
                                f"vision_config)")

    async def prompt(self, text: str, parts: list[MediaPart], mm_processor_kwargs: dict | None) -> MultiModalPrompt:
        """A rendered chat with its media fetched, decoded and processed, off the event loop."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, self._process, text, parts, mm_processor_kwargs)
        except MediaError as e:
            raise APIError(400, str(e), "messages") from None
        except ValueError as e:  # placeholders the template did not write, an image too thin to fit, ...
            raise APIError(400, f"messages: {e}", "messages") from None

    def _process(self, text: str, parts: list[MediaPart], mm_processor_kwargs: dict | None) -> MultiModalPrompt:
        images, videos, audios = load_media(parts, self.policy)
        return self.processor.process(text, images, videos, mm_processor_kwargs, add_special_tokens=False,
                                      audios=audios)
