"""Wires an engine client, metrics and the HTTP app together."""
import asyncio
import contextlib

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware

from atomlite.config import EngineConfig
from atomlite.engine.ipc.client import AsyncEngine, preload_structured_outputs
from atomlite.server.api import Server
from atomlite.server.auth import api_key_matches
from atomlite.server.chat import ChatOptions
from atomlite.server.body_limit import DEFAULT_MAX_REQUEST_SIZE, BodyLimit
from atomlite.server.body_parsing import BodyParser
from atomlite.server.errors import APIError, install_error_handlers
from atomlite.server.metrics import ServerMetrics
from atomlite.server.lora_routes import add_lora_routes
from atomlite.server.routes import add_routes


def engine_client(engine, max_waiting: int = 1024) -> AsyncEngine:
    """The client of an engine core: for an EngineConfig, a core process of its own (what `atomlite serve` runs);
    for an LLMEngine already built in this process, a core thread over it."""
    metrics = ServerMetrics()
    if isinstance(engine, EngineConfig):
        return AsyncEngine.launch(engine, max_waiting=max_waiting, metrics=metrics)
    return AsyncEngine.over(engine, max_waiting=max_waiting, metrics=metrics)


def make_app(engine, model_name: str, api_key: str | None = None, max_waiting: int = 1024,
             max_request_size: int = DEFAULT_MAX_REQUEST_SIZE, chat_options: ChatOptions = ChatOptions()) -> FastAPI:
    return build_app(engine_client(engine, max_waiting), model_name, api_key, max_request_size, chat_options)


def build_app(engine: AsyncEngine, model_name: str | list[str], api_key: str | None = None,
              max_request_size: int = DEFAULT_MAX_REQUEST_SIZE, chat_options: ChatOptions = ChatOptions(),
              cors: dict | None = None, loras=None) -> FastAPI:
    """The app over an engine client, started with the app unless already started. model_name: the served name, or
    several (the first is the one responses carry); cors: CORSMiddleware's settings, None for no CORS; loras: the
    LoRA adapters served by name (atomlite.lora.served.ServedAdapters), with --enable-lora."""
    server = Server(engine, model_name, api_key, chat_options, loras)
    bodies = BodyParser()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(bodies.start)
        if not engine.started:
            await asyncio.to_thread(engine.start)
        await asyncio.to_thread(preload_structured_outputs)
        await asyncio.to_thread(bodies.wait_ready)
        yield
        await asyncio.to_thread(engine.shutdown)
        bodies.stop()
        server.close()

    app = FastAPI(title="atomlite", lifespan=lifespan)
    app.state.server = server
    install_error_handlers(app)

    async def authorized(request: Request):
        if api_key is not None and not api_key_matches(request.headers.get("authorization"), api_key):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    add_routes(app, server, Depends(authorized), engine.metrics, bodies.dependency)
    add_lora_routes(app, server, Depends(authorized))
    app.add_middleware(BodyLimit, max_bytes=max_request_size)
    if cors is not None:  # outermost: a browser's preflight is answered before the API key is asked for
        app.add_middleware(CORSMiddleware, **cors)
    return app
