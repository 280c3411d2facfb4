"""How images bound a step's chunks (as vLLM schedules with disable_chunked_mm_input): an image's soft tokens are
never split across prefill chunks, since the queries of an image see the whole image (key_ends) and its keys must
then be in the cache by the end of the step; and the images a step must encode (in no cache and not already encoded
by this step) share an encoder budget of soft tokens per step (vLLM's max_num_encoder_input_tokens)."""
from collections.abc import Callable

from atomlite.engine.sequence import Sequence
from atomlite.engine.images.seq_images import images_in


class StepImageBudget:
    """One step's: fit() before a sequence's chunk is allocated, take() once it is."""

    def __init__(self, encoder_tokens: int, is_cached: Callable[[bytes], bool]):
        self.encoder_tokens = encoder_tokens
        self.is_cached = is_cached
        self.encoding: set[bytes] = set()

    def _cost(self, content_hash: bytes, length: int) -> int:
        return 0 if content_hash in self.encoding or self.is_cached(content_hash) else length

    def fit(self, seq: Sequence, num_new: int) -> int:
        """The most of seq's next num_new tokens a chunk may take: it ends before the first image it cannot take
        whole or encode within the budget left (0 when that image comes first: it waits for a step with room)."""
        if not seq.images:
            return num_new
        start = seq.num_computed_tokens
        left, counted = self.encoder_tokens, set()
        for image in images_in(seq.images, start, start + num_new):
            cost = 0 if image.content_hash in counted else self._cost(image.content_hash, image.length)
            if image.end > start + num_new or cost > left:
                return max(0, image.offset - start)
            left -= cost
            counted.add(image.content_hash)
        return num_new

    def take(self, seq: Sequence, num_new: int) -> None:
        if not seq.images:
            return
        start = seq.num_computed_tokens
        for image in images_in(seq.images, start, start + num_new):
            self.encoder_tokens -= self._cost(image.content_hash, image.length)
            self.encoding.add(image.content_hash)


class ImageScheduling:
    """What the scheduler knows of images: the per-step encoder budget and which items the encoder cache holds."""

    def __init__(self, max_num_encoder_input_tokens: int, is_cached: Callable[[bytes], bool] = lambda _: False):
        self.max_num_encoder_input_tokens = max_num_encoder_input_tokens
        self.is_cached = is_cached

    def step(self) -> StepImageBudget:
        return StepImageBudget(self.max_num_encoder_input_tokens, self.is_cached)
