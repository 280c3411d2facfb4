"""Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /tokenize, /detokenize,
/tokenizer_info; /v1/audio/transcriptions (server/transcription.py)."""
import contextlib
import time
import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from atomlite.server.api import ClientGone, EventStream, Server, collect, merge, sse
from atomlite.server.body_parsing import document_bodies, documented_body
from atomlite.server.errors import APIError
from atomlite.server.chat import OutputParsers
from atomlite.server.formatting import Formatter, chat_finish_reason, merged_delta, usage
from atomlite.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from atomlite.server.transcription import add_transcription_route

CLIENT_CLOSED = 499


def add_routes(app: FastAPI, server: Server, auth, metrics, body) -> None:
    """body(Model): the dependency that gives a request's body validated as Model (body_parsing)."""
    document_bodies(app, [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest])

    @app.get("/health")
    async def health():
        if not server.engine.is_running:
            return JSONResponse({"status": "stopping"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics", dependencies=[auth])  # behind the key when there is one, as vLLM; /health stays open
    async def metrics_endpoint():
        return Response(metrics.render() if metrics else b"", media_type=CONTENT_TYPE_LATEST)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "atomlite",
                "max_model_len": server.max_model_len}

    def adapter_card(name: str) -> dict:  # vLLM's: a LoRA adapter names its base model as its parent
        return {**model_card(name), "root": server.loras.by_name[name].lora_path, "parent": server.model_name}

    @app.get("/v1/models", dependencies=[auth])
    async def models():
        adapters = [adapter_card(name) for name in server.loras.by_name] if server.loras is not None else []
        return {"object": "list", "data": [model_card(name) for name in server.model_names] + adapters}

    @app.get("/v1/models/{model_id:path}", dependencies=[auth])
    async def model(model_id: str):
        return model_card(model_id) if server.check_model(model_id) is None else adapter_card(model_id)

    @app.post("/v1/completions", dependencies=[auth], openapi_extra=documented_body(CompletionRequest))
    async def completions(request: Request, req: CompletionRequest = Depends(body(CompletionRequest))):
        lora = server.check_model(req.model)
        fmt = server.formatter(lora)
        want_logprobs = req.logprobs is not None
        max_tokens = server.default_max_tokens(req.max_tokens, 16)

        def prepare():
            server.multimodal.check_kwargs(req.mm_processor_kwargs)
            prompts = server.completion_prompts(req.prompt, req.add_special_tokens, req.prompt_window)
            for ids, _ in prompts:
                server.check_lengths(ids, max_tokens)
            extra = {"logprobs": req.logprobs} if want_logprobs else {}
            if req.echo and want_logprobs:
                extra["prompt_logprobs"] = req.logprobs
            return prompts, [server.sampling_params(req, max_tokens, j, **extra) for j in range(req.n)]

        prompts, params = await server.off_loop(prepare)
        choices, gens = server.streams(prompts, req.n, params.__getitem__, priority=req.priority, lora=lora)
        request_id = f"cmpl-{req.request_id or uuid.uuid4().hex}"
        if req.stream:
            events = completion_events(fmt, request_id, choices, gens, req, want_logprobs)
            return EventStream(events, gens)
        try:
            await collect(request, choices, gens)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        return fmt.completion(request_id, choices, req.echo, want_logprobs, req.return_token_ids, req)

    @app.post("/v1/chat/completions", dependencies=[auth], openapi_extra=documented_body(ChatCompletionRequest))
    async def chat(request: Request, req: ChatCompletionRequest = Depends(body(ChatCompletionRequest))):
        lora = server.check_model(req.model)
        fmt = server.formatter(lora)
        ids, multimodal = await server.chat_prompt(req)
        max_tokens = server.default_max_tokens(req.max_completion_tokens or req.max_tokens,
                                               max(1, server.max_model_len - len(ids)))
        top = (req.top_logprobs or 0) if req.logprobs else None

        def prepare():
            server.check_lengths(ids, max_tokens)
            parsers, extra = server.chat_output(req)
            if top is not None:
                extra["logprobs"] = top
            return parsers, [server.sampling_params(req, max_tokens, j, **extra) for j in range(req.n)]

        parsers, params = await server.off_loop(prepare)
        choices, gens = server.streams([(ids, None)], req.n, params.__getitem__, multimodal, req.priority, lora)
        request_id = f"chatcmpl-{req.request_id or uuid.uuid4().hex}"
        if req.stream:
            return EventStream(chat_events(fmt, request_id, choices, gens, req, top, parsers), gens)
        try:
            await collect(request, choices, gens)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        return fmt.chat(request_id, choices, top, req.return_token_ids, parsers, req)

    add_transcription_route(app, server, auth)

    @app.get("/tokenizer_info", dependencies=[auth])
    async def tokenizer_info():
        tok = server.need_tokenizer("tokenizer_info")
        return {"eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": tok.pad_token,
                "chat_template": getattr(tok, "chat_template", None), "model_max_length": server.max_model_len,
                "tokenizer_class": type(tok).__name__}

    @app.post("/tokenize", dependencies=[auth], openapi_extra=documented_body(TokenizeRequest))
    async def tokenize(req: TokenizeRequest = Depends(body(TokenizeRequest))):
        server.check_model(req.model)
        tok = server.need_tokenizer("tokenize")

        def tokens_of() -> list[int]:
            if req.prompt is not None:
                server.check_prompt_chars(req.prompt, "prompt")
                return tok.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False)
            if server.multimodal.parts([m.model_dump(exclude_none=True) for m in req.messages]):
                raise APIError(400, "/tokenize does not fetch images or videos: send their messages to "
                                    "/v1/chat/completions", "messages")
            text = server.chat_template.render_request_text(req)
            server.check_prompt_chars(text, "messages")
            return server.chat_template.encode_request(req, text)

        tokens = await server.off_loop(tokens_of)
        body = {"tokens": tokens, "count": len(tokens), "max_model_len": server.max_model_len}
        if req.return_token_strs:
            body["token_strs"] = tok.convert_ids_to_tokens(tokens)
        return body

    @app.post("/detokenize", dependencies=[auth], openapi_extra=documented_body(DetokenizeRequest))
    async def detokenize(req: DetokenizeRequest = Depends(body(DetokenizeRequest))):
        server.check_model(req.model)
        server.need_tokenizer("detokenize")
        vocab = server.engine.vocab_size
        if any(t >= vocab for t in req.tokens):
            raise APIError(400, f"token ids must be below the vocabulary size {vocab}", "tokens")
        return {"prompt": await server.off_loop(server.tokenizer.decode, req.tokens)}


async def completion_events(fmt: Formatter, request_id, choices, gens, req: CompletionRequest, want_logprobs):
    started = set()
    async with contextlib.aclosing(merge(gens)) as deltas:
        async for i, delta in deltas:
            choice = choices[i]
            choice.add(delta)
            text, tokens, entries = delta.text, delta.token_ids, delta.logprobs
            if req.echo and i not in started:
                text, tokens, entries = choice.echoed(text, tokens, entries)
            started.add(i)
            logprobs = fmt.completion_logprobs(tokens, entries, as_ids=req.return_tokens_as_token_ids) \
                if want_logprobs else None
            chunk = fmt.completion_chunk(request_id, i, text, logprobs, delta.finish_reason if delta.finished else None,
                                         delta.token_ids if req.return_token_ids else None)
            if delta.finished:
                chunk["choices"][0]["stop_reason"] = delta.stop_reason
            yield sse(chunk)
    if req.stream_options and req.stream_options.include_usage:
        yield sse({**fmt.header(request_id, "text_completion"), "choices": [], "usage": usage(choices)})


async def chat_events(fmt: Formatter, request_id, choices, gens, req: ChatCompletionRequest, top,
                      parsers: OutputParsers):
    readers = [parsers.stream() if parsers.active else None for _ in choices]
    echoed = req.echoed_text(req.messages)
    for choice in choices:
        yield sse(fmt.chat_chunk(request_id, choice.index, {"role": "assistant", "content": echoed}, None, None))
    async with contextlib.aclosing(merge(gens)) as deltas:
        async for i, delta in deltas:
            choices[i].add(delta)
            logprobs = fmt.chat_logprobs(delta.token_ids, delta.logprobs, top, req.return_tokens_as_token_ids) \
                if top is not None else None
            reader = readers[i]
            if reader is None:
                message = {"content": delta.text} if delta.text else {}
            else:
                message = merged_delta(reader.feed(delta.text) + (reader.finish() if delta.finished else []))
                if not req.include_reasoning:
                    message.pop("reasoning_content", None)
            finish_reason = None
            if delta.finished:
                finish_reason = chat_finish_reason(delta.finish_reason, reader is not None and reader.made_tool_calls)
            elif not message and logprobs is None and not req.return_token_ids:
                continue  # tokens the parsers hold (a marker, a call's name so far): nothing to send yet
            chunk = fmt.chat_chunk(request_id, i, message, logprobs, finish_reason,
                                   delta.token_ids if req.return_token_ids else None)
            if delta.finished:
                chunk["choices"][0]["stop_reason"] = delta.stop_reason
            yield sse(chunk)
    if req.stream_options and req.stream_options.include_usage:
        yield sse({**fmt.header(request_id, "chat.completion.chunk"), "choices": [], "usage": usage(choices)})

