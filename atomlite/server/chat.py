"""The chat side of the API: requests rendered through the chat template (tools, earlier tool calls and their
results, template kwargs), and each choice's raw output turned into message fields by the model's reasoning and
tool-call parsers, whole or as stream deltas that join into the whole."""
from dataclasses import dataclass
from pathlib import Path

from atomlite.chat_template import render_chat_text
from atomlite.chat_text import ContentGuard
from atomlite.server.errors import APIError
from atomlite.server.parsers.gemma4_reasoning import CHANNEL_START, Gemma4ReasoningStream, join_reasoning_deltas
from atomlite.server.parsers.gemma4_tools import TOOL_CALL_START, Gemma4ToolCallStream, join_tool_call_deltas
from atomlite.server.protocol import ChatCompletionRequest, ChatMessage

PARSER_CHOICES = ("auto", "gemma4", "none")
TEMPLATE_ARGUMENTS = {"messages", "tools", "add_generation_prompt", "tokenize", "chat_template"}
# "auto" turns a parser on when the chat template writes what it reads
PARSER_MARKERS = {"tool_call_parser": TOOL_CALL_START, "reasoning_parser": CHANNEL_START}


@dataclass(frozen=True)
class ChatOptions:
    """`atomlite serve`'s chat flags (vLLM's names): --chat-template (a file or the template itself),
    --tool-call-parser and --reasoning-parser (gemma4, none, or auto: gemma4 when the template writes its
    markers). --trust-request-chat-template lets a request's text and chat_template_kwargs be template structure
    (special tokens typed in content become control tokens; bos_token and the like may be set), as before."""
    chat_template: str | None = None
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    # vLLM's: a request's chat_template is used only with this; it also lets client strings and template kwargs
    # write special tokens (atomlite's content guard off)
    trust_request_chat_template: bool = False


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a path to a Jinja file, or the template text itself (as vLLM takes it)."""
    if value is None:
        return None
    path = Path(value)
    if "{" not in value and path.is_file():
        return path.read_text()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template either")
    return value


def resolve_parser(flag: str, choice: str, template: str | None) -> str | None:
    if choice not in PARSER_CHOICES:
        raise ValueError(f"--{flag.replace('_', '-')} {choice!r}: choose one of {', '.join(PARSER_CHOICES)}")
    if choice == "auto":
        return "gemma4" if template and PARSER_MARKERS[flag] in template else None
    return None if choice == "none" else choice


class ChatTemplate:
    """Renders chat requests with the model's template (or --chat-template's) and knows which parsers apply."""

    def __init__(self, tokenizer, options: ChatOptions):
        self.tokenizer, self.options = tokenizer, options
        self.template = load_chat_template(options.chat_template) or getattr(tokenizer, "chat_template", None)
        self.tool_call_parser = resolve_parser("tool_call_parser", options.tool_call_parser, self.template)
        self.reasoning_parser = resolve_parser("reasoning_parser", options.reasoning_parser, self.template)
        self.guard = None if options.trust_request_chat_template else ContentGuard(tokenizer)

    def render(self, messages: list[ChatMessage], tools: list | None = None,
               template_kwargs: dict | None = None) -> list[int]:
        return self.encode(self.render_text(messages, tools, template_kwargs))

    def encode(self, text: str) -> list[int]:
        """Token ids of render_text's text: special tokens only where the template wrote them."""
        if self.guard is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.guard.encode(text)

    def render_request(self, req) -> list[int]:
        """A chat or /tokenize request's prompt ids (request_extras.ChatRendering's fields honoured)."""
        return self.encode_request(req, self.render_request_text(req))

    def encode_request(self, req, text: str) -> list[int]:
        """render_request_text's text as ids; add_special_tokens puts the tokenizer's own (BOS) before them."""
        if self.guard is None:
            return self.tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))
        added = self.tokenizer.encode("", add_special_tokens=True) if req.add_special_tokens else []
        return added + self.guard.encode(text)

    def render_request_text(self, req) -> str:
        template = req.chat_template
        if template is not None and not self.options.trust_request_chat_template:
            raise APIError(400, "a request's chat_template is used only when the server runs with "
                                "--trust-request-chat-template", "chat_template")
        return self.render_text(req.messages, req.tools, req.template_variables(), req.add_generation_prompt,
                                req.continue_final_message, template)

    def render_text(self, messages: list[ChatMessage], tools: list | None = None,
                    template_kwargs: dict | None = None, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, template: str | None = None) -> str:
        """The template's text; an image or video part is one placeholder in it."""
        template = template or self.template
        if not template:
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions or serve with "
                                "--chat-template")
        reserved = TEMPLATE_ARGUMENTS & set(template_kwargs or {})
        if reserved:
            raise APIError(400, f"chat_template_kwargs may not set {sorted(reserved)}", "chat_template_kwargs")
        dumped = [m.model_dump(exclude_none=True) for m in messages]
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        if self.guard is not None:
            self._refuse_structure_kwargs(template_kwargs or {})
            dumped, tool_dicts, template_kwargs = map(self.guard.mark, (dumped, tool_dicts, template_kwargs))
        try:
            if continue_final_message:
                template_kwargs = {**(template_kwargs or {}), "continue_final_message": True}
            return render_chat_text(self.tokenizer, dumped, tool_dicts, template, template_kwargs,
                                    add_generation_prompt)
        except Exception as e:  # the template's own raise_exception, a kwarg it cannot take, arguments not JSON
            raise APIError(400, f"the chat template refused these messages: {e}", "messages") from e

    def _refuse_structure_kwargs(self, template_kwargs: dict) -> None:
        """Template variables that name special tokens (bos_token, eos_token, ...) are the template's structure: a
        request that sets them could write any turn it likes."""
        named = self.guard.structure_kwargs(template_kwargs)
        if named:
            raise APIError(400, f"chat_template_kwargs may not set {named}: they name the chat template's special "
                                f"tokens (serve with --trust-request-chat-template to allow it)",
                           "chat_template_kwargs")

    def request_parsers(self, req: ChatCompletionRequest) -> "OutputParsers":
        tool_choice = req.effective_tool_choice()
        if tool_choice != "none" and self.tool_call_parser is None:
            raise APIError(400, f"tool_choice {_choice_name(tool_choice)!r} needs a tool-call parser, and this "
                                f"model's chat template writes no tool calls atomlite knows: serve with "
                                f"--tool-call-parser gemma4 (and a --chat-template that renders tools)",
                           "tool_choice")
        return OutputParsers(self.reasoning_parser is not None, tool_choice != "none", req.parallel_tool_calls)


def _choice_name(choice) -> str:
    return choice if isinstance(choice, str) else choice.function.name


@dataclass(frozen=True)
class OutputParsers:
    """Which parsers read a request's output: thinking into reasoning_content, tool calls into tool_calls."""
    reasoning: bool
    tools: bool
    parallel_tool_calls: bool = True

    @property
    def active(self) -> bool:
        return self.reasoning or self.tools

    def stream(self) -> "ChoiceParser":
        return ChoiceParser(self)

    def message(self, text: str) -> dict:
        """A complete output's message fields: content, and reasoning_content / tool_calls where present."""
        parser = self.stream()
        return join_deltas(parser.feed(text) + parser.finish())


class ChoiceParser:
    """One choice's output, fed as it streams: thinking first, then the answer's content and tool calls."""

    def __init__(self, parsers: OutputParsers):
        self.parsers = parsers
        self._reasoning = Gemma4ReasoningStream() if parsers.reasoning else None
        self._tools = Gemma4ToolCallStream() if parsers.tools else None
        self.made_tool_calls = False

    def feed(self, text: str) -> list[dict]:
        return self._route(self._reasoning.feed(text) if self._reasoning else [{"content": text}], final=False)

    def finish(self) -> list[dict]:
        return self._route(self._reasoning.finish() if self._reasoning else [], final=True)

    def _route(self, deltas: list[dict], final: bool) -> list[dict]:
        out = []
        for delta in deltas:
            if "content" in delta and self._tools is not None:
                out += self._tools.feed(delta["content"])
            else:
                out.append(delta)
        if final and self._tools is not None:
            out += self._tools.finish()
        return [d for d in map(self._keep_calls_allowed, out) if d]

    def _keep_calls_allowed(self, delta: dict) -> dict | None:
        calls = delta.get("tool_calls")
        if calls is None:
            return delta if any(delta.values()) else None
        if not self.parsers.parallel_tool_calls:  # one call asked for: later ones are dropped
            calls = [c for c in calls if c["index"] == 0]
        self.made_tool_calls |= bool(calls)
        return {"tool_calls": calls} if calls else None


def join_deltas(deltas: list[dict]) -> dict:
    """The message fields a client rebuilds from a stream's deltas."""
    reasoning, _ = join_reasoning_deltas(deltas)
    joined = join_tool_call_deltas(deltas)
    message = {"content": joined.content or (None if joined.tool_calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if joined.tool_calls:
        message["tool_calls"] = joined.tool_calls
    return message
