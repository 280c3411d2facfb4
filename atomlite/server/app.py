"""Wires an engine, its async loop, metrics and the HTTP app together."""
from atomlite.engine.async_engine import AsyncEngine
from atomlite.engine.llm_engine import LLMEngine
from atomlite.server.api import build_app
from atomlite.server.metrics import ServerMetrics


def make_app(engine: LLMEngine, model_name: str, api_key: str | None = None, max_waiting: int = 1024):
    metrics = ServerMetrics()
    async_engine = AsyncEngine(engine, max_waiting=max_waiting, metrics=metrics)
    return build_app(async_engine, model_name, api_key, metrics)
