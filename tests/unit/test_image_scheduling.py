"""The encoder cache's byte bound and recency, and how images bound a step's chunks: never split, the step's encoder
budget shared by the images it must encode (each once), a cached image free."""
import torch

from atomlite import SamplingParams
from atomlite.engine.images.encoder_cache import EncoderCache
from atomlite.engine.images.image_budget import StepImageBudget
from atomlite.engine.images.seq_images import SeqItem, outside_images
from atomlite.engine.sequence import Sequence


def soft(tokens: int) -> torch.Tensor:
    return torch.zeros(tokens, 4)  # 16 bytes a token


def test_the_encoder_cache_evicts_the_least_recently_used_to_stay_within_its_bytes():
    cache = EncoderCache(100)
    cache.put(b"a", soft(2))
    cache.put(b"b", soft(3))
    assert cache.get(b"a") is not None  # a is now the more recent
    cache.put(b"c", soft(2))
    assert b"b" not in cache and b"a" in cache and b"c" in cache and cache.num_bytes == 64
    cache.put(b"d", soft(7))  # larger than the whole cache: not kept
    assert b"d" not in cache and cache.num_bytes == 64


def image(offset: int, length: int, key: bytes = b"x") -> SeqItem:
    return SeqItem(offset, length, key, "image", (torch.zeros(1), torch.zeros(1)))


def seq_with(images: list[SeqItem], length: int = 100, computed: int = 0) -> Sequence:
    seq = Sequence(list(range(length)), SamplingParams(), images=images)
    seq.num_computed_tokens = computed
    return seq


def test_a_chunk_ends_before_an_image_it_cannot_take_whole():
    budget = StepImageBudget(1000, lambda _: False)
    seq = seq_with([image(10, 30)])
    assert budget.fit(seq, 25) == 10 and budget.fit(seq, 40) == 40
    assert budget.fit(seq_with([image(10, 30)], computed=10), 20) == 0  # it waits for a step with room


def test_images_a_step_must_encode_share_its_encoder_budget_each_counted_once():
    budget = StepImageBudget(50, lambda key: key == b"cached")
    first = seq_with([image(0, 30, b"p"), image(40, 30, b"q")])
    assert budget.fit(first, 100) == 40  # q would pass the budget
    budget.take(first, 40)
    again = seq_with([image(5, 30, b"p"), image(50, 30, b"cached")])
    assert budget.fit(again, 100) == 100  # p is encoded by this step already, the other is cached
    assert budget.fit(seq_with([image(0, 30, b"r")]), 100) == 0


def test_text_sequences_pass_unchanged():
    budget = StepImageBudget(0, lambda _: False)
    assert budget.fit(seq_with([]), 77) == 77


def test_a_position_inside_an_image_moves_to_its_start():
    images = [image(8, 10), image(20, 5)]
    assert [outside_images(images, p) for p in (8, 9, 17, 18, 19, 22, 25)] == [8, 8, 8, 18, 19, 20, 25]
