"""/v1/audio/transcriptions, as vLLM offers it for speech-capable models and OpenAI's client calls it: a multipart
upload (file, model, language, prompt, response_format json or text, temperature, stream, and vLLM's
max_completion_tokens). The clip becomes a
one-turn chat through the model's template: an instruction ("Transcribe this audio", with the language where given,
and the caller's prompt as context) and the clip; the model's answer is the transcript. A stream sends OpenAI's
transcript.text.delta events, then transcript.text.done."""
import asyncio
import contextlib
import uuid

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import PlainTextResponse, Response

from atomlite.chat_template import render_chat_text
from atomlite.multimodal.audio import decode_audio
from atomlite.multimodal.media import MediaError
from atomlite.sampling_params import SamplingParams
from atomlite.server.api import ClientGone, EventStream, Server, collect, merge, sse
from atomlite.server.errors import APIError

CLIENT_CLOSED = 499
RESPONSE_FORMATS = ("json", "text")
# ISO 639-1 codes the instruction names in words (the model reads the language's name); others are refused
LANGUAGES = {"ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fr": "French", "hi": "Hindi",
             "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish",
             "pt": "Portuguese", "ru": "Russian", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian",
             "vi": "Vietnamese", "zh": "Chinese"}


def instruction(language: str | None, prompt: str | None) -> str:
    text = f"Transcribe this audio into {LANGUAGES[language]}." if language else "Transcribe this audio."
    return f"{text} Context: {prompt}" if prompt else text


def _checked_form(language: str | None, response_format: str, temperature: float,
                  max_completion_tokens: int | None) -> None:
    if language is not None and language not in LANGUAGES:
        raise APIError(400, f"language {language!r} is not one of {', '.join(sorted(LANGUAGES))} (ISO 639-1)",
                       "language")
    if response_format not in RESPONSE_FORMATS:
        raise APIError(400, f"response_format {response_format!r} is not one of {', '.join(RESPONSE_FORMATS)}",
                       "response_format")
    if not 0 <= temperature <= 2:
        raise APIError(400, f"temperature {temperature} must be between 0 and 2", "temperature")
    if max_completion_tokens is not None and max_completion_tokens < 1:
        raise APIError(400, "max_completion_tokens must be at least 1", "max_completion_tokens")


def add_transcription_route(app: FastAPI, server: Server, auth) -> None:
    @app.post("/v1/audio/transcriptions", dependencies=[auth])
    async def transcriptions(request: Request, file: UploadFile = File(...), model: str = Form(...),
                             language: str | None = Form(None), prompt: str | None = Form(None),
                             response_format: str = Form("json"), temperature: float = Form(0.0),
                             stream: bool = Form(False), max_completion_tokens: int | None = Form(None)):
        server.check_model(model)
        _checked_form(language, response_format, temperature, max_completion_tokens)
        try:
            server.multimodal.check_modality("audio", "file")
        except MediaError as e:
            raise APIError(400, str(e), "file") from None
        data = await file.read(server.multimodal.policy.max_bytes + 1)
        if len(data) > server.multimodal.policy.max_bytes:
            raise APIError(400, f"file: the upload is over {server.multimodal.policy.max_bytes} bytes", "file")
        ids, multimodal = await _prompt(server, data, instruction(language, prompt))
        max_tokens = max_completion_tokens or max(1, server.max_model_len - len(ids))
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        await server.off_loop(server.check_lengths, ids, params.max_tokens)
        choices, gens = server.streams([(ids, None)], 1, lambda j: params, multimodal)
        request_id = f"trsc-{uuid.uuid4().hex}"
        if stream:
            return EventStream(_events(choices, gens), gens)
        try:
            await collect(request, choices, gens)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        text = choices[0].text
        if response_format == "text":
            return PlainTextResponse(text)
        return {"text": text, "id": request_id, "usage": {"type": "tokens", "input_tokens": len(ids),
                                                          "output_tokens": len(choices[0].token_ids)}}


async def _prompt(server: Server, data: bytes, text: str):
    """The one-turn chat of the clip, decoded and processed off the event loop: (token ids, MultiModalPrompt)."""
    tokenizer = server.need_tokenizer("transcription")
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise APIError(400, "the model's tokenizer has no chat template to write the transcription prompt with",
                       "model")
    messages = [{"role": "user", "content": [{"type": "text", "text": text},
                                             {"type": "input_audio", "input_audio": {}}]}]

    def build():
        samples = decode_audio(data, "file")
        rendered = render_chat_text(tokenizer, messages, None, template)
        return server.multimodal.processor.process(rendered, audios=[samples], add_special_tokens=False,
                                                   names=("images", "videos", "file"))
    try:
        processed = await asyncio.get_running_loop().run_in_executor(server.multimodal.pool, build)
    except MediaError as e:
        raise APIError(400, str(e), "file") from None
    return processed.prompt_token_ids, processed


async def _events(choices, gens):
    async with contextlib.aclosing(merge(gens)) as deltas:
        async for i, delta in deltas:
            choices[i].add(delta)
            if delta.text:
                yield sse({"type": "transcript.text.delta", "delta": delta.text})
    yield sse({"type": "transcript.text.done", "text": choices[0].text})
