"""vLLM's runtime LoRA endpoints: POST /v1/load_lora_adapter {"lora_name", "lora_path"} and
/v1/unload_lora_adapter {"lora_name"}, served where VLLM_ALLOW_RUNTIME_LORA_UPDATING is true (vLLM's switch; off,
they answer 404 naming it). A request names a loaded adapter by its `model`."""
import asyncio
import os

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from atomlite.lora.peft import AdapterNotFound
from atomlite.lora.served import RUNTIME_UPDATING
from atomlite.server.errors import APIError


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None


def runtime_updating() -> bool:
    return os.environ.get(RUNTIME_UPDATING, "").lower() in ("1", "true")


def add_lora_routes(app: FastAPI, server, auth) -> None:
    def adapters():
        if not runtime_updating():
            raise APIError(404, f"runtime LoRA loading is off: start the server with {RUNTIME_UPDATING}=True")
        if server.loras is None:
            raise APIError(400, "LoRA is not enabled: start the server with --enable-lora")
        return server.loras

    @app.post("/v1/load_lora_adapter", dependencies=[auth])
    async def load_lora_adapter(req: LoadLoRAAdapterRequest):
        loras = adapters()
        if req.load_inplace and req.lora_name in loras.by_name:
            loras.remove(req.lora_name)
        try:
            await asyncio.to_thread(loras.add, req.lora_name, req.lora_path)
        except AdapterNotFound as e:
            raise APIError(404, str(e), "lora_path") from None
        except ValueError as e:
            raise APIError(400, str(e), "lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", dependencies=[auth])
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest):
        try:
            adapters().remove(req.lora_name)
        except AdapterNotFound as e:
            raise APIError(404, str(e), "lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
