"""OpenAI request schemas. Types are strict (no "5" for 5, no 1.0 for an int) so a malformed request is a 400,
and every bound the engine relies on is checked here."""
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP = 16

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
Stop = NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP)] | None
Penalty = Annotated[StrictFloat, Field(ge=-2.0, le=2.0)]
TokenIdKey = Annotated[StrictStr, Field(pattern=r"^[0-9]{1,18}$")]  # JSON object keys are strings: {"50256": -100}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[StrictFloat, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0.0, le=1.0)] | None = None
    top_k: StrictInt | None = None
    seed: StrictInt | None = None
    stop: Stop = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    ignore_eos: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # vLLM's extra request fields
    repetition_penalty: Annotated[StrictFloat, Field(gt=0.0, allow_inf_nan=False)] | None = None
    min_p: Annotated[StrictFloat, Field(ge=0.0, le=1.0)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    logit_bias: dict[TokenIdKey, Annotated[StrictFloat, Field(allow_inf_nan=False)]] | None = None
    bad_words: list[NonEmptyStr] | None = None
    allowed_token_ids: TokenIds | None = None
    user: StrictStr | None = None
    return_token_ids: StrictBool = False  # vLLM's: each choice (and stream chunk) carries its token ids

    @model_validator(mode="after")
    def _top_k_range(self):
        if self.top_k is not None and self.top_k != -1 and self.top_k < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return self


class CompletionRequest(SamplingFields):
    prompt: NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1)]
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | Annotated[list[TextPart], Field(min_length=1)]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return self


class TokenizeRequest(BaseModel):
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    model: StrictStr | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    tokens: list[Annotated[StrictInt, Field(ge=0)]]
    model: StrictStr | None = None
