"""Chat messages (OpenAI's shape) rendered with a chat template into prompt token ids: shared by `LLM.chat` and
the server."""
import json


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, chat_template: str | None = None,
                template_kwargs: dict | None = None, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of messages through chat_template (the tokenizer's when None); tools and template_kwargs reach
    the template as variables. A ValueError names what the template could not take."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the model's tokenizer has no chat template: pass chat_template")
    text = tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, chat_template=template,
                                         tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **(template_kwargs or {}))
    return tokenizer.encode(text, add_special_tokens=False)


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them (transformers' convention): tool call arguments as objects (OpenAI
    sends JSON text), and each tool result named after the call it answers (Gemma 4 writes `response:NAME{...}`)."""
    out, call_names = [], {}
    for i, m in enumerate(messages):
        message = {key: value for key, value in m.items() if value is not None}
        message.pop("annotations", None)  # citations of an earlier answer: nothing a template writes
        refusal = message.pop("refusal", None)  # an earlier answer's text when it refused
        if isinstance(message.get("content"), list):
            message["content"] = "".join(part["text"] for part in message["content"])
        message.setdefault("content", refusal or "")
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_call(i, j, call) for j, call in enumerate(message["tool_calls"])]
            call_names.update({c["id"]: c["function"]["name"] for c in message["tool_calls"] if c.get("id")})
        if message["role"] == "tool" and "name" not in message:
            message["name"] = call_names.get(message.get("tool_call_id"))
        out.append(message)
    return out


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
