"""Chat messages (OpenAI's shape) rendered with a chat template into prompt token ids: shared by `LLM.chat` and
the server."""
import json

TEMPLATE_PARTS = {"text": "text", "image_url": "image", "video_url": "video", "input_audio": "audio",
                  "audio_url": "audio"}


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, chat_template: str | None = None,
                template_kwargs: dict | None = None, add_generation_prompt: bool = True, encode=None) -> list[int]:
    """Token ids of messages through chat_template (the tokenizer's when None); tools and template_kwargs reach
    the template as variables. encode(text): how the rendered text becomes ids (a ContentGuard's, for marked
    strings), else the tokenizer's. A ValueError names what the template could not take."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the model's tokenizer has no chat template: pass chat_template")
    text = render_chat_text(tokenizer, messages, tools, template, template_kwargs, add_generation_prompt)
    return encode(text) if encode is not None else tokenizer.encode(text, add_special_tokens=False)


def render_chat_text(tokenizer, messages: list[dict], tools: list[dict] | None, chat_template: str,
                     template_kwargs: dict | None = None, add_generation_prompt: bool = True) -> str:
    """The template's text, before tokenizing: image and video parts stay one placeholder each, for the
    multimodal processor to expand."""
    return tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, chat_template=chat_template,
                                         tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **(template_kwargs or {}))


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them (transformers' convention): tool call arguments as objects (OpenAI
    sends JSON text), and each tool result named after the call it answers (Gemma 4 writes `response:NAME{...}`)."""
    out, call_names = [], {}
    for i, m in enumerate(messages):
        message = {key: value for key, value in m.items() if value is not None}
        message.pop("annotations", None)  # citations of an earlier answer: nothing a template writes
        refusal = message.pop("refusal", None)  # an earlier answer's text when it refused
        if isinstance(message.get("content"), list):
            message["content"] = template_content(i, message["content"])
        message.setdefault("content", refusal or "")
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_call(i, j, call) for j, call in enumerate(message["tool_calls"])]
            call_names.update({c["id"]: c["function"]["name"] for c in message["tool_calls"] if c.get("id")})
        if message["role"] == "tool" and "name" not in message:
            message["name"] = call_names.get(message.get("tool_call_id"))
        out.append(message)
    return out


def template_content(i: int, parts: list[dict]) -> str | list[dict]:
    """Text parts joined into one string; with media, the parts as transformers' templates read them:
    {"type": "text", "text"}, {"type": "image"}, {"type": "video"}, {"type": "audio"}."""
    kinds = [part.get("type") for part in parts]
    unknown = [f"messages[{i}].content[{j}]" for j, kind in enumerate(kinds) if kind not in TEMPLATE_PARTS]
    if unknown:
        raise ValueError(f"{unknown[0]}: a content part is text, image_url, video_url, input_audio or audio_url")
    if all(kind == "text" for kind in kinds):
        return "".join(part["text"] for part in parts)
    return [{"type": "text", "text": part["text"]} if kind == "text" else {"type": TEMPLATE_PARTS[kind]}
            for part, kind in zip(parts, kinds)]


def _template_call(i: int, j: int, call: dict) -> dict:
    arguments = call["function"]["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"messages.{i}.tool_calls.{j}.function.arguments is not JSON: {e}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"messages.{i}.tool_calls.{j}.function.arguments must be a JSON object")
    return {**call, "type": "function", "function": {**call["function"], "arguments": arguments}}
