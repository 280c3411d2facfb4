"""speculative_config, in vLLM's names: {"method": "mtp" | "ngram", "model": PATH, "num_speculative_tokens": k,
"prompt_lookup_min": n, "prompt_lookup_max": n}."""
import json
from dataclasses import dataclass, fields

from atomlite.errors import ConfigError

METHODS = ("mtp", "ngram")
NGRAM_DEFAULT = 5  # vLLM's n-gram size when neither bound is given


@dataclass
class SpeculativeConfig:
    method: str | None = None
    num_speculative_tokens: int | None = None
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def __post_init__(self):
        if self.method is None:
            self.method = "mtp" if self.model is not None else None
        if self.method == "draft_model":
            raise ConfigError("speculative_config method 'draft_model' (a separate small model with its own KV "
                              "cache) is not supported; use 'mtp' with a Gemma 4 assistant checkpoint, or 'ngram'")
        if self.method not in METHODS:
            raise ConfigError(f"speculative_config needs method one of {', '.join(METHODS)} (or a model, which "
                              f"means mtp), got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ConfigError(f"speculative_config num_speculative_tokens must be an integer >= 1, got {k!r}")
        if self.method == "mtp" and not self.model:
            raise ConfigError("speculative_config method 'mtp' needs model: the assistant checkpoint's folder "
                              "(e.g. google/gemma-4-31B-it-assistant)")
        if self.method == "ngram":
            self._check_ngram()
        elif self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ConfigError("speculative_config prompt_lookup_min/max apply to method 'ngram' only")

    def _check_ngram(self) -> None:
        if self.model is not None:
            raise ConfigError("speculative_config method 'ngram' drafts from the prompt and output: it takes no model")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        low = high if low is None else low
        high = low if high is None else high
        self.prompt_lookup_min = NGRAM_DEFAULT if low is None else low
        self.prompt_lookup_max = NGRAM_DEFAULT if high is None else high
        if not all(isinstance(n, int) and n >= 1 for n in (self.prompt_lookup_min, self.prompt_lookup_max)) \
                or self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                              f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")

    @classmethod
    def parse(cls, value: "str | dict | SpeculativeConfig | None") -> "SpeculativeConfig | None":
        """A JSON text (--speculative-config), a dict (LLM(speculative_config=...)), or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--speculative-config is not valid JSON ({e}): e.g. "
                                  f"'{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}'") from None
        if not isinstance(value, dict):
            raise ConfigError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"speculative_config has unknown field(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(known))}")
        return cls(**value)

    def describe(self) -> str:
        source = self.model if self.method == "mtp" else \
            f"prompt lookup, n-grams {self.prompt_lookup_min}..{self.prompt_lookup_max}"
        return f"speculative decoding: {self.method} ({source}), {self.num_speculative_tokens} draft tokens per step"
