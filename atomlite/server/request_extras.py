"""Request fields beyond the sampling ones (protocol.py): vLLM's extra parameters and OpenAI's fields, each honoured,
taken with no effect where that is its meaning here (docs/SERVING.md lists them), or refused by name with the
reason. A field in none of these is still a 400 (protocol.py's extra="forbid")."""
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

MAX_LOGPROBS = 20

# field -> why atomlite refuses it when given (anything but null)
REFUSED = {
    "logits_processors": "atomlite runs no logits processor named by a request",
    "vllm_xargs": "atomlite has no extension that reads vllm_xargs",
    "kv_transfer_params": "atomlite has no disaggregated prefill",
    "ec_transfer_params": "atomlite has no disaggregated encoder cache",
    "logprob_token_ids": "ask for top logprobs instead (logprobs / top_logprobs)",
    "thinking_token_budget": "atomlite does not bound thinking tokens; bound the whole output with max_tokens",
    "repetition_detection": "use repetition_penalty or frequency_penalty",
    "prompt_embeds": "atomlite takes prompts as text or token ids",
    "cache_salt": "atomlite's prefix cache is shared by every request; serve with --no-enable-prefix-caching where "
                  "one user must not time another's prompts",
}
CHAT_REFUSED = {
    "audio": "atomlite answers with text only",
    "functions": "OpenAI's deprecated functions: send them as tools",
    "function_call": "OpenAI's deprecated function_call: use tool_choice",
    "web_search_options": "atomlite searches nothing",
}


def _refuse_given(model: BaseModel, refused: dict) -> None:
    for name, why in refused.items():
        if getattr(model, name, None) is not None:
            raise ValueError(f"{name} is not supported: {why}")


class RequestExtras(BaseModel):
    """Fields both endpoints take."""
    # vLLM's, honoured
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    truncate_prompt_tokens: Annotated[StrictInt, Field(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    request_id: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    return_tokens_as_token_ids: StrictBool | None = None
    use_beam_search: StrictBool = False
    # vLLM's, no effect here: fast tokenizers ignore it; beam search's; chunking of a stream; routing ids
    spaces_between_special_tokens: StrictBool = True
    length_penalty: Annotated[StrictFloat, Field(allow_inf_nan=False)] | StrictInt = 1.0
    stream_interval: Annotated[StrictInt, Field(ge=1)] | None = None
    session_id: StrictStr | None = None
    # OpenAI's, no effect here: atomlite stores nothing, has one service tier and its own prefix cache
    store: StrictBool | None = None
    metadata: dict[str, StrictStr] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    # refused when given (REFUSED says why)
    logits_processors: Any = None
    vllm_xargs: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    logprob_token_ids: Any = None
    thinking_token_budget: Any = None
    repetition_detection: Any = None
    cache_salt: Any = None

    @model_validator(mode="after")
    def _refused_fields(self):
        _refuse_given(self, REFUSED)
        if self.use_beam_search:
            raise ValueError("use_beam_search is not supported: atomlite has no beam search (sample n sequences "
                             "instead)")
        return self

    def prompt_window(self, ids: list[int], max_model_len: int) -> list[int]:
        """vLLM's truncate_prompt_tokens: the last k tokens (the first k with truncation_side "right"); -1: the
        context length."""
        k = self.truncate_prompt_tokens
        if k is None:
            return ids
        k = max_model_len if k == -1 else k
        return ids[:k] if self.truncation_side == "right" else ids[max(0, len(ids) - k):]


class CompletionExtras(BaseModel):
    add_special_tokens: StrictBool = True  # vLLM's: the tokenizer's BOS on text prompts
    best_of: Annotated[StrictInt, Field(ge=1)] | None = None  # OpenAI's legacy; only best_of == n
    suffix: None = None  # OpenAI's insert mode; refused unless null
    prompt_embeds: Any = None

    @model_validator(mode="after")
    def _completion_refusals(self):
        if self.best_of is not None and self.best_of != getattr(self, "n", 1):
            raise ValueError("best_of other than n is not supported (vLLM dropped it too): sample n sequences and "
                             "rank them by their logprobs")
        _refuse_given(self, {"prompt_embeds": REFUSED["prompt_embeds"]})
        return self


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ChatRendering(BaseModel):
    """How messages become the prompt (the chat endpoint and /tokenize alike)."""
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool | None = None  # chat: False (the template writes BOS)
    documents: list[dict[str, StrictStr]] | None = None
    chat_template: StrictStr | None = None  # with --trust-request-chat-template only
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra variables for the chat template
    reasoning_effort: ReasoningEffort | None = None  # OpenAI's: thinking on or off where the template has it

    @model_validator(mode="after")
    def _continue_or_answer(self):
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt false (the final message is "
                             "continued, not answered)")
        return self

    def template_variables(self) -> dict:
        """What the chat template gets beside messages and tools: documents, reasoning_effort, and (vLLM's mapping)
        enable_thinking = reasoning_effort != "none" unless chat_template_kwargs sets it; chat_template_kwargs
        win."""
        extra: dict = {}
        if self.documents is not None:
            extra["documents"] = self.documents
        if self.reasoning_effort is not None:
            extra["reasoning_effort"] = self.reasoning_effort
            extra["enable_thinking"] = self.reasoning_effort != "none"
        return {**extra, **(self.chat_template_kwargs or {})}


class ChatExtras(ChatRendering):
    # vLLM's, honoured
    echo: StrictBool = False
    include_reasoning: StrictBool = True
    # OpenAI's: text-only answers; no effect
    modalities: list[Literal["text"]] | None = None
    prediction: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    # refused when given (CHAT_REFUSED says why)
    audio: Any = None
    functions: Any = None
    function_call: Any = None
    web_search_options: Any = None

    @model_validator(mode="after")
    def _chat_refusals(self):
        _refuse_given(self, CHAT_REFUSED)
        return self

    def echoed_text(self, messages: list) -> str:
        """vLLM's chat echo: the last message's text when it has the answer's role (assistant, or with
        add_generation_prompt false, its own)."""
        if not self.echo or not messages:
            return ""
        last = messages[-1]
        return last.text() if (not self.add_generation_prompt or last.role == "assistant") else ""
