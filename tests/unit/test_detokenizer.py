"""Incremental detokenization gives exactly the text of decoding the whole output at once, at every step a prefix
of it, for a byte-fallback tokenizer (multi-byte characters split over tokens) and the demo's char tokenizer."""
import random

import pytest

from atomlite.demo.tokenizer import build_char_tokenizer
from atomlite.engine.detokenizer import IncrementalDetokenizer, exact_backend

PIECES = ["▁", "a", "b", "▁the", "é", "€", "ab", "▁a", "\n", "日本", "😀", "<start_of_turn>"]


def byte_fallback_tokenizer():
    """A Gemma-style tokenizer: BPE with <0xXX> byte tokens, "▁" for spaces, special tokens."""
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])}
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
    vocab.update({piece: len(vocab) + i for i, piece in enumerate(PIECES)})
    return GemmaTokenizer(vocab=vocab, merges=[], additional_special_tokens=["<start_of_turn>"])


class PythonDecodeTokenizer:
    """Any object with decode(): the detokenizer must take its own window path."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, token_ids, skip_special_tokens=False):
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


TOKENIZERS = {"byte_fallback": byte_fallback_tokenizer, "char": build_char_tokenizer}


def utf8_heavy_ids(tokenizer, rng: random.Random, length: int) -> list[int]:
    """Mostly whole multi-byte characters as byte tokens (so most windows end mid-character), some cut short or
    stray bytes, some special tokens, some ordinary ids."""
    ids = []
    while len(ids) < length:
        roll = rng.random()
        if roll < 0.4:
            char = rng.choice("é€日本😀𝔘ß")
            ids.extend(tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in char.encode()[:rng.choice([4, 4, 1])])
        elif roll < 0.5:
            ids.append(rng.choice(tokenizer.all_special_ids))
        else:
            ids.append(rng.randrange(len(tokenizer)))
    return ids


def random_ids(name: str, tokenizer, rng: random.Random, length: int) -> list[int]:
    if name == "byte_fallback":
        return utf8_heavy_ids(tokenizer, rng, length)
    return [rng.randrange(len(tokenizer)) for _ in range(length)]


def feed_in_random_steps(detok: IncrementalDetokenizer, ids: list[int], rng: random.Random) -> list[str]:
    """Feeds ids 1-3 at a time; returns detok.text after each step."""
    texts, i = [], 0
    while i < len(ids):
        step = rng.choice([1, 1, 1, 2, 3])
        detok.add(ids[i:i + step])
        i += step
        texts.append(detok.text)
    return texts


@pytest.mark.parametrize("use_decode_stream", [True, False])
@pytest.mark.parametrize("name", TOKENIZERS)
def test_finished_text_equals_whole_decode(name, use_decode_stream):
    tokenizer = TOKENIZERS[name]()
    assert exact_backend(tokenizer) is not None
    rng = random.Random(0)
    for trial in range(150):
        ids = random_ids(name, tokenizer, rng, rng.randrange(1, 40))
        detok = IncrementalDetokenizer(tokenizer, use_decode_stream=use_decode_stream)
        feed_in_random_steps(detok, ids, rng)
        assert detok.finish() == detok.text == tokenizer.decode(ids, skip_special_tokens=True), (trial, ids)


@pytest.mark.parametrize("use_decode_stream", [True, False])
def test_text_given_out_is_never_taken_back_on_valid_utf8(use_decode_stream):
    tokenizer = byte_fallback_tokenizer()
    rng = random.Random(1)
    for trial in range(100):
        text = "".join(rng.choice(["é", "€", "日本", "😀", "𝔘", " the", "ab", "\n"]) for _ in range(12))
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok = IncrementalDetokenizer(tokenizer, use_decode_stream=use_decode_stream)
        steps = feed_in_random_steps(detok, ids, rng)
        assert all(text.startswith(t) for t in steps), (trial, text)
        assert steps[-1] == text


def test_multi_byte_character_waits_for_its_last_byte():
    tokenizer = byte_fallback_tokenizer()
    euro = [tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "€".encode()]
    for detok in (IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(PythonDecodeTokenizer(tokenizer))):
        assert [detok.add([t]) for t in euro[:2]] == ["", ""]
        assert detok.add(euro[2:]) == "€"
        assert detok.add(euro[:1]) == ""
        # a byte run with an invalid byte decodes to one U+FFFD per byte, the "€" given out before included
        assert detok.finish() == tokenizer.decode(euro + euro[:1]) == "\ufffd" * 4


def test_tokenizer_without_fast_backend_uses_its_own_decode():
    tokenizer = PythonDecodeTokenizer(build_char_tokenizer())
    assert exact_backend(tokenizer) is None
    ids = tokenizer.tokenizer.encode("Hello, world")
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.add([t]) for t in ids) == detok.finish() == "Hello, world"


def test_stop_strings_spanning_steps_cut_where_the_whole_text_first_holds_one(random_model_dir):
    """Each stop string here spans several tokens (one character each): the engine searches only the new text and
    a tail, and must still cut where a search over the whole text would."""
    from atomlite import LLM, SamplingParams
    llm = LLM(str(random_model_dir), dtype="float32", device="cpu")
    params = dict(temperature=0, max_tokens=60, ignore_eos=True)
    free = llm.generate("Once", SamplingParams(**params))[0].outputs[0].text
    rng = random.Random(2)
    stop_lists = [[free[i:i + rng.randrange(2, 5)] for i in rng.sample(range(10, len(free) - 5), 2)]
                  for _ in range(4)]
    outs = llm.generate(["Once"] * len(stop_lists), [SamplingParams(**params, stop=s) for s in stop_lists])
    for stops, out in zip(stop_lists, outs):
        cut = min(free.find(s) for s in stops)
        assert out.outputs[0].finish_reason == "stop"
        assert out.outputs[0].text == free[:cut], stops
