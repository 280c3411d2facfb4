"""Request bodies validated away from the event loop that answers /health. pydantic-core holds the GIL while it
parses (a 3.6 MiB body of token ids: 1.4 s, and a thread beside the loop stalled it as long), so a body over
IN_PROCESS_BYTES goes to a worker process of its own, started with the app; smaller ones take a few ms on the
loop. Errors come back as the error list FastAPI's validation handler reads, so both answer alike."""
import asyncio
import concurrent.futures
import importlib
import multiprocessing
import os

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from atomlite.cpu_threads import use_one_thread
from atomlite.heap import freeze_startup_heap
from atomlite.lifetime import die_with_parent
from atomlite.server.errors import APIError

IN_PROCESS_BYTES = 256 * 2**10
PARSER_NICENESS = 10  # a large body waits a little longer, not the engine core beside it


def _validate(model: type[BaseModel], body: bytes):
    """-> (the request, None) or (None, the validation errors)."""
    try:
        return model.model_validate_json(body), None
    except ValidationError as e:
        return None, e.errors(include_url=False, include_context=False)


def _load_models() -> None:
    """The worker's first job: the request models imported before a request waits on them (at the usual priority,
    so the server is not slower to start on a loaded machine), then its priority lowered: a 2 MB body of token ids
    takes a core for ~0.35 s, which the engine core beside it needs more."""
    importlib.import_module("atomlite.server.protocol")
    use_one_thread()  # torch comes with the atomlite package; its OpenMP pool here would only compete
    freeze_startup_heap()
    os.nice(PARSER_NICENESS)


class BodyParser:
    def __init__(self):
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._loaded: concurrent.futures.Future | None = None

    def start(self) -> None:
        """The worker process, spawned (not forked: the API process has threads); it imports the request models
        (torch among them: 4 s on the idle 2-core machine, more when loaded) while the engine starts."""
        self.pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                           initializer=die_with_parent, initargs=(os.getpid(),))
        self._loaded = self.pool.submit(_load_models)

    def wait_ready(self) -> None:
        """Returns once the worker has its imports, so no large body waits on them (nor competes with them for the
        cores) once the server answers."""
        if self._loaded is not None:
            self._loaded.result()

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None

    def dependency(self, model: type[BaseModel]):
        """A FastAPI dependency giving the request body as `model`."""
        async def parse(request: Request) -> BaseModel:
            check_json_content_type(request.headers.get("content-type"))
            body = await request.body()
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                raise APIError(400, "the request body is not valid JSON text (it must be UTF-8)") from None
            if len(body) > IN_PROCESS_BYTES and self.pool is not None:
                parsed, errors = await asyncio.wrap_future(self.pool.submit(_validate, model, body))
            else:
                parsed, errors = _validate(model, body)
            if errors:
                raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors])
            return parsed
        return parse


def check_json_content_type(content_type: str | None) -> None:
    """POST bodies are JSON and say so: a form or text/plain body (what a web page may send to another site without
    asking it first) is refused before it is read, so no page can start generations on a server it can reach."""
    media_type = (content_type or "").split(";")[0].strip().lower()
    if media_type != "application/json" and not (media_type.startswith("application/")
                                                  and media_type.endswith("+json")):
        raise APIError(415, f"the request body must be JSON, sent with 'Content-Type: application/json' (got "
                            f"{content_type or 'no Content-Type'!r})")


def documented_body(model: type[BaseModel]) -> dict:
    """A route's openapi_extra naming `model` as its JSON body (FastAPI documents only the bodies it parses)."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def document_bodies(app, models: list[type[BaseModel]]) -> None:
    """The app's OpenAPI schema, with these models (and the models they use) among its components."""
    generate = app.openapi

    def openapi() -> dict:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            described = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(described.pop("$defs", {}))
            components[model.__name__] = described
        return schema
    app.openapi = openapi
