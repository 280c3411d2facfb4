"""Wires an engine, its async loop, metrics and the HTTP app together."""
import asyncio
import contextlib

from fastapi import Depends, FastAPI, Request

from atomlite.engine.async_engine import AsyncEngine
from atomlite.engine.llm_engine import LLMEngine
from atomlite.server.api import Server
from atomlite.server.errors import APIError, install_error_handlers
from atomlite.server.metrics import ServerMetrics
from atomlite.server.routes import add_routes


def make_app(engine: LLMEngine, model_name: str, api_key: str | None = None, max_waiting: int = 1024):
    metrics = ServerMetrics()
    async_engine = AsyncEngine(engine, max_waiting=max_waiting, metrics=metrics)
    return build_app(async_engine, model_name, api_key, metrics)


def build_app(engine: AsyncEngine, model_name: str, api_key: str | None = None, metrics=None) -> FastAPI:
    server = Server(engine, model_name, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not engine.is_running:
            engine.start()
        yield
        await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="atomlite", lifespan=lifespan)
    app.state.server = server
    install_error_handlers(app)

    async def authorized(request: Request):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    add_routes(app, server, Depends(authorized), metrics)
    return app
