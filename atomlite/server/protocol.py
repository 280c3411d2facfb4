"""OpenAI request schemas. Types are strict (no "5" for 5, no 1.0 for an int) so a malformed request is a 400,
and every bound the engine relies on is checked here."""
from typing import Annotated, Any, Literal

from atomlite.server.request_extras import ChatExtras, ChatRendering, CompletionExtras, RequestExtras
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator,
                      model_validator)

MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP = 16
MAX_TOOLS = 128

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
Stop = NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP)] | None
Penalty = Annotated[StrictFloat, Field(ge=-2.0, le=2.0)]
TokenIdKey = Annotated[StrictStr, Field(pattern=r"^[0-9]{1,18}$")]  # JSON object keys are strings: {"50256": -100}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: StrictStr
    description: StrictStr | None = None
    schema_: dict[str, Any] = Field(alias="schema")  # "schema" itself would shadow a BaseModel attribute
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's: text (no constraint), json_object (any JSON object) or json_schema."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('json_schema is required with type "json_schema", and only there')
        return self


class StructuredOutputsFields(BaseModel):
    """vLLM's structured_outputs request field; exactly one of these (StructuredOutputsParams checks that)."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_: dict[str, Any] | StrictStr | None = Field(None, alias="json")  # "json" would shadow BaseModel.json
    regex: StrictStr | None = None
    choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None


class SamplingFields(RequestExtras):
    model_config = ConfigDict(extra="forbid")  # a field atomlite does not honour is a 400 naming it

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
    priority: StrictInt = 0  # vLLM's: with --scheduling-policy priority, lower runs first
    return_token_ids: StrictBool = False  # vLLM's: each choice (and stream chunk) carries its token ids
    mm_processor_kwargs: dict[str, Any] | None = None  # vLLM's: e.g. {"max_soft_tokens": 560} for this request
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsFields | None = None  # vLLM's

    @model_validator(mode="after")
    def _top_k_range(self):
        if self.top_k is not None and self.top_k < -1:
            raise ValueError("top_k must be -1 or 0 (off) or >= 1")
        return self

    @model_validator(mode="after")
    def _one_output_constraint(self):
        if self.structured_outputs is not None and self.response_format is not None \
                and self.response_format.type != "text":
            raise ValueError("give response_format or structured_outputs, not both")
        return self


class CompletionRequest(SamplingFields, CompletionExtras):
    prompt: NonEmptyStr | Annotated[list[NonEmptyStr], Field(min_length=1)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1)]
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ImageURL(BaseModel):
    url: NonEmptyStr  # data:image/...;base64, or an http(s) / file:// URL the server's media flags allow
    detail: Literal["auto", "low", "high"] | None = None  # OpenAI's; Gemma 4 reads every image alike


class ImageURLPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(BaseModel):
    url: NonEmptyStr


class VideoURLPart(BaseModel):
    """vLLM's video part."""
    type: Literal["video_url"]
    video_url: VideoURL


class InputAudio(BaseModel):
    data: NonEmptyStr  # base64 of the file's bytes
    format: NonEmptyStr  # "wav", "mp3", ...: checked where the clip is decoded (multimodal.chat_media)


class InputAudioPart(BaseModel):
    """OpenAI's audio part."""
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURLPart(BaseModel):
    """vLLM's audio part."""
    type: Literal["audio_url"]
    audio_url: VideoURL


ContentPart = Annotated[TextPart | ImageURLPart | VideoURLPart | InputAudioPart | AudioURLPart,
                        Field(discriminator="type")]
UNSUPPORTED_PARTS = ("file",)  # refused by name rather than ignored
ToolName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]


class FunctionCall(BaseModel):
    name: ToolName
    arguments: StrictStr  # a JSON object, as OpenAI sends it


class ToolCall(BaseModel):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[ContentPart], Field(min_length=1)] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None  # a tool message: the call it answers
    reasoning_content: StrictStr | None = None  # an assistant's earlier thinking
    # what clients echo back of an earlier answer: a refusal is that turn's text; annotations (citations) carry
    # nothing the model reads; a legacy function_call or audio would, and is refused unless null
    refusal: StrictStr | None = None
    annotations: list | None = None
    function_call: None = None
    audio: None = None

    @field_validator("content", mode="before")
    @classmethod
    def _known_parts(cls, content):
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") in UNSUPPORTED_PARTS:
                raise ValueError(f"{part['type']} content is not supported: atomlite reads text, image_url, "
                                 f"video_url, input_audio and audio_url parts")
        return content

    @model_validator(mode="after")
    def _fields_of_the_role(self):
        if self.content is None and not (self.role == "assistant" and (self.tool_calls or self.refusal)):
            raise ValueError("content is required (only an assistant message with tool_calls or a refusal may "
                             "leave it out)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return self

    def text(self) -> str:
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: ToolName
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: StrictBool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    name: ToolName


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: ToolChoiceFunction


class ChatCompletionRequest(SamplingFields, ChatExtras):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return self

    @model_validator(mode="after")
    def _tool_choice_needs_its_tool(self):
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools: give the tools it may call")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        return self

    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: auto when tools are given, none otherwise."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"


class TokenizeRequest(ChatRendering):
    """vLLM's: a prompt, or messages rendered exactly as the chat endpoint renders them (tools, template kwargs)."""
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    return_token_strs: StrictBool | None = None
    model: StrictStr | None = None

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    tokens: list[Annotated[StrictInt, Field(ge=0)]]
    model: StrictStr | None = None
