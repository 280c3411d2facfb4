"""Request handling of the OpenAI-compatible API over the async engine, and the streaming pieces the routes share.
Nothing here knows the routes: app.py wires both into the FastAPI app."""
import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from atomlite.engine.ipc.client import AsyncEngine, Delta, EngineStopped, QueueFull, check_structured_outputs
from atomlite.sampling_params import SamplingParams, StructuredOutputsParams
from atomlite.chat_text import OPEN
from atomlite.server.chat import ChatOptions, ChatTemplate, OutputParsers
from atomlite.server.errors import NESTED_TOO_DEEPLY, APIError, error_body
from atomlite.multimodal.inputs import MultiModalPrompt
from atomlite.server.formatting import Choice, Formatter
from atomlite.server.multimodal import MultiModalInputs
from atomlite.server.offload import Offload
from atomlite.server.protocol import ChatCompletionRequest, NamedToolChoice, SamplingFields
from atomlite.server.tool_grammar import tool_call_grammar

DISCONNECT_POLL_S = 0.25


class ClientGone(Exception):
    pass


class Server:
    """Request handling that does not depend on FastAPI: prompts -> engine streams -> OpenAI bodies."""

    def __init__(self, engine: AsyncEngine, model_name: str | list[str], api_key: str | None,
                 chat_options: ChatOptions = ChatOptions(), loras=None):
        self.model_names = [model_name] if isinstance(model_name, str) else list(model_name)
        self.loras = loras  # the adapters served by name (atomlite.lora.served.ServedAdapters), with --enable-lora
        self.engine, self.model_name, self.api_key = engine, self.model_names[0], api_key
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.fmt = Formatter(self.tokenizer, self.model_name)  # responses name the first served name, as vLLM
        self.chat_template = ChatTemplate(self.tokenizer, chat_options) if self.tokenizer is not None else None
        self.multimodal = MultiModalInputs(engine.config, self.tokenizer, model_name)
        self.offload = Offload()
        self.max_chars_per_token = max_chars_per_token(self.tokenizer)

    async def off_loop(self, fn, *args):
        """fn(*args) on the preparation threads (offload.py), away from the event loop."""
        return await self.offload.run(fn, *args)

    def close(self) -> None:
        self.offload.close()
        self.multimodal.close()

    # -- checks ---------------------------------------------------------------------------------------------
    def check_model(self, name: str | None):
        """The LoRARequest of the adapter a request's model names; None for the base model."""
        if name is None or name in self.model_names:
            return None
        if self.loras is not None and name in self.loras.by_name:
            return self.loras.by_name[name]
        served = ", ".join(f"`{n}`" for n in self.model_names + list(self.loras.by_name if self.loras else ()))
        raise APIError(404, f"The model `{name}` does not exist; this server serves {served}", "model")

    def formatter(self, lora) -> Formatter:
        """The responses' formatter: they name the adapter a request ran with, else the first served name (as
        vLLM)."""
        return self.fmt if lora is None else Formatter(self.tokenizer, lora.lora_name)

    def need_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise APIError(400, f"this model has no tokenizer, so {what} is not available; send token ids")
        return self.tokenizer

    def check_lengths(self, ids: list[int], max_tokens: int) -> None:
        self.engine.validate_prompt(ids)
        if len(ids) + max_tokens > self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens; the request "
                                f"has {len(ids)} prompt tokens and asks for {max_tokens} more. Lower max_tokens "
                                f"or shorten the prompt.", "max_tokens")

    def check_prompt_chars(self, text: str, field: str) -> None:
        """vLLM's early refusal: text longer than max_model_len tokens of the longest token can hold can never fit,
        so it is refused before anything tokenizes it."""
        limit = self.max_model_len * self.max_chars_per_token
        if len(text) > limit:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens; the {field} has "
                                f"{len(text)} characters, more than the {limit} that {self.max_model_len} tokens can "
                                f"hold (at most {self.max_chars_per_token} characters each). Shorten the {field}.",
                           field)

    def sampling_params(self, req: SamplingFields, max_tokens: int, seed_offset: int, **extra) -> SamplingParams:
        """The request's SamplingParams, checked against the model (bad_words tokenized, token ids in the
        vocabulary, the output constraint's schema, regex or grammar built) so that a bad value is a 400 before
        anything is queued."""
        constraint = _output_constraint(req)
        if constraint is not None:
            field, structured_outputs = constraint
            if "structured_outputs" in extra:
                raise APIError(400, f"{field} cannot be combined with a forced tool call", field)
            extra["structured_outputs"] = structured_outputs
        defaults = self.engine.config.generation_defaults.sampling

        def given(name: str, fallback):  # the request's value, else the generation config's, else vLLM's default
            value = getattr(req, name)
            return value if value is not None else defaults.get(name, fallback)

        controls = {k: defaults[k] for k in ("repetition_penalty", "min_p") if k in defaults}
        controls.update(_logits_controls(req))
        extra.setdefault("skip_special_tokens", req.skip_special_tokens)
        if req.prompt_logprobs is not None:
            extra["prompt_logprobs"] = req.prompt_logprobs
        params = SamplingParams(
            temperature=given("temperature", 1.0), top_p=given("top_p", 1.0), top_k=given("top_k", -1),
            max_tokens=max_tokens, seed=None if req.seed is None else req.seed + seed_offset, stop=req.stop,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, **controls, **extra)
        params.bind_to_model(self.tokenizer, self.engine.vocab_size)
        return params

    # -- prompts ---------------------------------------------------------------------------------------------
    def default_max_tokens(self, requested: int | None, fallback: int) -> int:
        """A request's max_tokens, else the generation config's max_new_tokens, else fallback."""
        if requested is not None:
            return requested
        return min(self.engine.config.generation_defaults.sampling.get("max_tokens", fallback), fallback)

    def completion_prompts(self, prompt, add_special_tokens: bool = True,
                           window=lambda ids, max_model_len: ids) -> list[tuple[list[int], str | None]]:
        """window(ids, max_model_len): the part of each prompt kept (truncate_prompt_tokens)."""
        out = []
        for ids, text in self._completion_prompts(prompt, add_special_tokens):
            kept = window(ids, self.max_model_len)
            out.append((kept, text if len(kept) == len(ids) else self.engine.decode(kept)))
        return out

    def _completion_prompts(self, prompt, add_special_tokens: bool) -> list[tuple[list[int], str | None]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        elif isinstance(prompt[0], int):
            prompt = [prompt]
        out = []
        for p in prompt:
            if isinstance(p, str):
                self.check_prompt_chars(p, "prompt")
                out.append((self.need_tokenizer("a text prompt").encode(p, add_special_tokens=add_special_tokens), p))
            else:
                self.engine.validate_prompt(list(p))  # before decoding: ids beyond the vocabulary are an error
                out.append((list(p), self.engine.decode(p) if self.tokenizer is not None else None))
        return out

    async def chat_prompt(self, req: ChatCompletionRequest) -> tuple[list[int], MultiModalPrompt | None]:
        """The prompt's token ids, and with images or videos the MultiModalPrompt they belong to."""
        prompt, parts = await self.off_loop(self.render_chat, req)
        if not parts:
            return prompt, None
        mm_prompt = await self.multimodal.prompt(prompt, parts, req.mm_processor_kwargs)
        return mm_prompt.prompt_token_ids, mm_prompt

    def render_chat(self, req: ChatCompletionRequest) -> tuple[list[int] | str, list]:
        """(token ids, []) of a text chat; (its text, or its ids where the client's text held special tokens' text,
        the image and video parts) of one with media."""
        self.need_tokenizer("chat")
        self.multimodal.check_kwargs(req.mm_processor_kwargs)
        parts = self.multimodal.parts([m.model_dump(exclude_none=True) for m in req.messages])
        text = self.chat_template.render_request_text(req)
        self.check_prompt_chars(text, "messages")
        if not parts:
            return req.prompt_window(self.chat_template.encode_request(req, text), self.max_model_len), parts
        if OPEN in text:
            return self.chat_template.encode(text), parts
        return text, parts

    def chat_output(self, req: ChatCompletionRequest) -> tuple[OutputParsers, dict]:
        """The parsers of the request's output, and what its SamplingParams need for them: special tokens kept
        in the text (the parsers read the markers), and for tool_choice "required" or a named tool, a grammar
        that forces the call."""
        parsers = self.chat_template.request_parsers(req)
        extra = {"skip_special_tokens": False} if parsers.active else {}
        choice = req.effective_tool_choice()
        if choice == "required" or isinstance(choice, NamedToolChoice):
            tools = [t.model_dump(exclude_none=True) for t in req.tools]
            name = None if choice == "required" else choice.function.name
            try:
                forced = StructuredOutputsParams(grammar=tool_call_grammar(tools, name, req.parallel_tool_calls))
                check_structured_outputs(forced)
            except ValueError as e:
                raise APIError(400, f"tool_choice {choice if name is None else name!r} cannot be forced: {e}",
                               "tools") from e
            extra["structured_outputs"] = forced
        return parsers, extra

    # -- streams ---------------------------------------------------------------------------------------------
    def streams(self, prompts: list[tuple[list[int], str | None]], n: int, make_params,
                multimodal: MultiModalPrompt | None = None, priority: int = 0, lora=None) -> tuple[list, list]:
        """Admits and queues every sequence of a request at once (or none); the caller must close the returned
        generations (merge() and EventStream do). multimodal: the one prompt's images and video frames."""
        try:
            self.engine.config.check_priority(priority)
        except ValueError as e:
            raise APIError(400, str(e), "priority") from e
        params = [make_params(j) for j in range(n)]  # any invalid choice fails before a sequence is queued
        if len(prompts) * n > self.engine.max_waiting:
            raise APIError(400, f"this request has {len(prompts) * n} sequences ({len(prompts)} prompts x n={n}); the "
                                f"server queues at most {self.engine.max_waiting} (--max-waiting), so it can never "
                                f"be admitted: send fewer prompts per request", "prompt" if len(prompts) > 1 else "n")
        self.engine.admit(len(prompts) * n)
        base = uuid.uuid4().hex
        choices, gens = [], []
        for p, (ids, text) in enumerate(prompts):
            for j in range(n):
                index = p * n + j
                choices.append(Choice(index, p, ids, text))
                gens.append(self._generate(f"{base}-{index}", ids, params[j], multimodal, priority, lora))
        return choices, gens

    def _generate(self, request_id: str, ids: list[int], params: SamplingParams,
                  multimodal: MultiModalPrompt | None, priority: int = 0, lora=None):
        """The one place a prompt is handed to the engine (lora: the adapter's LoRARequest, None for the base)."""
        return self.engine.generate(request_id, ids, params, priority, multimodal, lora)


def max_chars_per_token(tokenizer) -> int:
    """The most characters one token of the vocabulary holds (vLLM's max_chars_per_token)."""
    if tokenizer is None:
        return 1
    return max(1, max((len(t) for t in tokenizer.get_vocab()), default=1))


def _output_constraint(req: SamplingFields) -> tuple[str, StructuredOutputsParams] | None:
    """(the request field, its constraint) for response_format json_object / json_schema or structured_outputs,
    checked: a bad one is a 400 naming the field."""
    response_format, fields = req.response_format, req.structured_outputs
    if fields is not None:
        given = fields.model_dump(by_alias=True, exclude_none=True)
        field, name = "structured_outputs", None
        if len(given) == 1:
            field = f"structured_outputs.{next(iter(given))}"
    elif response_format is not None and response_format.type != "text":
        json_schema = response_format.json_schema
        given = {"json": json_schema.schema_} if json_schema is not None else {"json_object": True}
        field, name = "response_format", "response_format.json_schema.schema"
    else:
        return None
    try:
        constraint = StructuredOutputsParams(**given)
        check_structured_outputs(constraint, name)
    except ValueError as e:
        raise APIError(400, str(e), field) from None
    return field, constraint


def _logits_controls(req: SamplingFields) -> dict:
    """The request's logits controls that were given, in SamplingParams' terms (those left out keep its defaults)."""
    given = {name: getattr(req, name) for name in ("frequency_penalty", "presence_penalty", "repetition_penalty",
                                                     "min_p", "min_tokens", "logit_bias", "bad_words",
                                                     "allowed_token_ids")}
    return {name: value for name, value in given.items() if value is not None}


async def merge(gens: list) -> AsyncIterator[tuple[int, Delta]]:
    """Deltas of several engine streams as they come; leaving early closes (aborts) every stream."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, gen):
        try:
            async with contextlib.aclosing(gen):
                async for delta in gen:
                    queue.put_nowait((i, delta))
        except Exception as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for gen in gens:  # a pump cancelled before it started never closed its sequence, queued since streams()
            await gen.aclose()


async def collect(request: Request, choices: list[Choice], gens: list) -> None:
    """Gather every delta into its choice; a client that hangs up aborts the requests."""
    async def consume():
        async with contextlib.aclosing(merge(gens)) as deltas:
            async for i, delta in deltas:
                choices[i].add(delta)

    task = asyncio.create_task(consume())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream that fails midway still ends in an OpenAI error event and [DONE], never a cut connection."""
    try:
        async for event in events:
            yield event
    except (EngineStopped, QueueFull, ValueError) as e:
        yield sse(error_body(503 if not isinstance(e, ValueError) else 400, str(e)))
    except RecursionError:
        yield sse(error_body(400, NESTED_TOO_DEEPLY))
    except Exception as e:  # noqa: BLE001 - reported to the client, logged by uvicorn's caller
        yield sse(error_body(500, f"internal error: {type(e).__name__}"))
    yield sse("[DONE]")


class EventStream(StreamingResponse):
    """The SSE response of a streamed request: guarded(events), and its sequences closed however the response ends
    (a failed stream, a client gone midway). Also when its body is never read: a client gone before the headers
    were sent makes Starlette skip the body, so cleanup inside the body generator would never run (its sequences
    ran to max_tokens)."""

    def __init__(self, events: AsyncIterator[str], gens: list):
        super().__init__(guarded(events), media_type="text/event-stream")
        self.gens = gens

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for gen in self.gens:
                await gen.aclose()
