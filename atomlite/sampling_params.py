import json
import math
from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5
SEED_MIN, SEED_MAX = -2**63, 2**64 - 1  # what torch.Generator.manual_seed accepts
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound; larger biases are clamped to it
ENCODE_CHUNK = 64  # bad_words tokenized per call (_encoded)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_nonnegative_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _token_id_key(key) -> int:
    """A logit_bias key as a token id: OpenAI clients send them as strings ({"50256": -100})."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    if not _is_nonnegative_int(key):
        raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {key!r}")
    return key


def _clamped_bias(bias) -> float:
    if not _is_number(bias):
        raise ValueError(f"logit_bias values must be finite numbers, got {bias!r}")
    return min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, float(bias)))


STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def _is_set(value) -> bool:
    return value is not None and value is not False  # json_object=False is vLLM's "not asked for"


@dataclass
class StructuredOutputsParams:
    """vLLM's constrained decoding request; exactly one field is set. json: a JSON schema (a dict, or the JSON
    text of one) the output must satisfy; regex: a regular expression the whole output must match; choice: the
    output is one of these strings; grammar: an EBNF grammar in xgrammar's dialect (rule `root` is the start);
    json_object: True for any JSON object."""
    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        given = [kind for kind in STRUCTURED_OUTPUT_KINDS if _is_set(getattr(self, kind))]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(STRUCTURED_OUTPUT_KINDS)}; "
                             f"got {' and '.join(given) if given else 'none'}")
        self._validate_value()

    def _validate_value(self) -> None:
        kind, value = self.kind, self.value
        if kind == "json":
            self.schema()
        elif kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
            raise ValueError(f"structured_outputs.{kind} must be a non-empty string")
        elif kind == "choice" and (not isinstance(value, list) or not value
                                   or not all(isinstance(c, str) for c in value)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        elif kind == "json_object" and value is not True:
            raise ValueError("structured_outputs.json_object must be true (or left out)")

    @property
    def kind(self) -> str:
        """The field that is set: json, regex, choice, grammar or json_object."""
        return next(kind for kind in STRUCTURED_OUTPUT_KINDS if _is_set(getattr(self, kind)))

    @property
    def value(self):
        return getattr(self, self.kind)

    def schema(self) -> dict:
        """json as a dict."""
        schema = self.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            except RecursionError:
                raise ValueError("structured_outputs.json is nested too deeply") from None
        if not isinstance(schema, dict):
            raise ValueError("structured_outputs.json must be a JSON schema object (a dict or its JSON text)")
        try:
            json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise ValueError(f"structured_outputs.json is not JSON data: {e}") from None
        except RecursionError:
            raise ValueError("structured_outputs.json is nested too deeply") from None
        return schema

    @property
    def cache_key(self) -> tuple[str, str]:
        """Equal for requests that constrain the output the same way (property order counts: it is the order
        the output follows)."""
        value = self.value
        return self.kind, value if isinstance(value, str) else json.dumps(value)


@dataclass
class SamplingParams:
    """Same field names, defaults and meanings as vLLM's. temperature 0 (or below 1e-5) means greedy; top_k 0 or -1
    is off. n: output sequences per prompt (with a seed, the j-th samples with seed + j). include_stop_str_in_output
    keeps the stop string that ended the output in its text.

    Logits controls, applied to greedy and sampled rows alike, before the choice: allowed_token_ids (only these may
    be chosen), bad_words (a word's last token is blocked where the output so far ends with the rest of it),
    min_tokens (EOS and stop_token_ids blocked until that many output tokens exist), logit_bias ({token id: bias},
    clamped to [-100, 100]), repetition_penalty (over prompt and output: positive logits divided by it, negative
    ones multiplied), frequency_penalty and presence_penalty (over the output: each subtracted times the token's
    count, and once if it occurs). min_p (after temperature: tokens below min_p times the top probability dropped)
    only matters for sampled rows. structured_outputs (StructuredOutputsParams) constrains the output to a JSON
    schema, regex, choice or grammar; the sequence stops ("stop") once the grammar allows nothing more. Reported
    logprobs are the model's own, before any of these."""
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    spaces_between_special_tokens: bool = True  # fast tokenizers (the only kind atomlite loads) ignore it
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, init=False, repr=False)
    _bound_to: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _bad_words_index: object = field(default=None, init=False, repr=False, compare=False)  # logits_controls'

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1
        if isinstance(self.logit_bias, dict):
            self.logit_bias = {_token_id_key(k): _clamped_bias(v) for k, v in self.logit_bias.items()}
        self.validate()

    def validate(self) -> None:
        def bad(msg):
            raise ValueError(msg)
        if self.seed is not None and (not isinstance(self.seed, int) or not SEED_MIN <= self.seed <= SEED_MAX):
            bad(f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}], got {self.seed!r}")
        if not _is_nonnegative_int(self.n) or self.n < 1:
            bad(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature:
            bad(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            bad(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                bad(f"{name} must be an integer >= 0, got {value!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop must be a non-empty string or a list of them")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers")
        self._validate_logits_controls()

    def _validate_logits_controls(self) -> None:
        def bad(msg):
            raise ValueError(msg)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                bad(f"{name} must be in [-2, 2], got {value!r}")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            bad(f"repetition_penalty must be > 0 (1 is off), got {self.repetition_penalty!r}")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_nonnegative_int(self.min_tokens) or self.min_tokens > self.max_tokens:
            bad(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if self.logit_bias is not None and (
                not isinstance(self.logit_bias, dict) or not all(map(_is_nonnegative_int, self.logit_bias))
                or not all(_is_number(v) and abs(v) <= MAX_LOGIT_BIAS for v in self.logit_bias.values())):
            bad("logit_bias must map token ids (integers >= 0) to biases in [-100, 100]")
        if self.allowed_token_ids is not None and (
                not isinstance(self.allowed_token_ids, list) or not self.allowed_token_ids
                or not all(map(_is_nonnegative_int, self.allowed_token_ids))):
            bad("allowed_token_ids must be a non-empty list of token ids (integers >= 0)")
        if self.bad_words is not None and (
                not isinstance(self.bad_words, list) or not all(isinstance(w, str) and w.strip()
                                                                for w in self.bad_words)):
            bad("bad_words must be a list of strings, none empty or only spaces")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                bad("structured_outputs must be a StructuredOutputsParams")
            self.structured_outputs.validate()

    def bind_to_model(self, tokenizer, vocab_size: int) -> None:
        """Turns bad_words into token ids with the model's tokenizer (vLLM's way: each word as written and, where
        it tokenizes to as many tokens as a different first one, with a leading space, as words mid-text are) and
        checks every token id against the vocabulary. Params bound before to the same words and model (the API
        process binds them, then the engine core) are not tokenized again: 20,000 words took seconds."""
        bound_to = (vocab_size, getattr(tokenizer, "name_or_path", None), tuple(self.bad_words or ()))
        if bound_to == self._bound_to:
            return
        self._bad_words_token_ids, self._bad_words_index, self._bound_to = [], None, None
        if self.bad_words:
            if tokenizer is None:
                raise ValueError("bad_words needs the model's tokenizer, and this model has none; "
                                 "use logit_bias or allowed_token_ids with token ids instead")
            self._bad_words_token_ids = _bad_word_token_ids(self.bad_words, tokenizer)
        self._check_vocabulary(vocab_size)
        self._bound_to = bound_to

    def _check_vocabulary(self, vocab_size: int) -> None:
        for name, ids in (("logit_bias", self.logit_bias or ()), ("allowed_token_ids", self.allowed_token_ids or ()),
                          ("bad_words", [t for word in self._bad_words_token_ids for t in word])):
            outside = sorted({t for t in ids if t >= vocab_size})
            if outside:
                raise ValueError(f"{name} has token ids outside the vocabulary (size {vocab_size}): {outside[:8]}")

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        """bad_words as token id sequences, once bind_to_model has run."""
        return self._bad_words_token_ids

    @property
    def uses_logits_controls(self) -> bool:
        """Whether anything but temperature, top-k, top-p and min-p changes this row's next-token choice."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self._bad_words_token_ids
                    or self.allowed_token_ids is not None)

    @property
    def uses_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        # below this, dividing logits by the temperature overflows float32; the result is argmax anyway
        return self.temperature < GREEDY_BELOW


def _encoded(texts: list[str], tokenizer) -> list[list[int]]:
    """Each text's token ids without special tokens. A fast tokenizer's Rust batches, ENCODE_CHUNK texts each:
    one call per text held the GIL most of the time, one batch of 40,000 held it 0.4-0.6 s at a time (either way
    the API process's event loop stalled), batches of 64 a few ms."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    out = []
    for start in range(0, len(texts), ENCODE_CHUNK):
        out += [e.ids for e in backend.encode_batch(texts[start:start + ENCODE_CHUNK], add_special_tokens=False)]
    return out


def _bad_word_token_ids(words: list[str], tokenizer) -> list[list[int]]:
    stripped = [word.lstrip() for word in words]
    encoded = _encoded(stripped + [" " + word for word in stripped], tokenizer)
    sequences = []
    for plain, spaced in zip(encoded[:len(words)], encoded[len(words):]):
        if not plain:
            continue
        sequences.append(plain)
        if len(spaced) == len(plain) and spaced[0] != plain[0]:
            sequences.append(spaced)
    return sequences
