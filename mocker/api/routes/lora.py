"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter (only
with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING set, as in vLLM; else they 404)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from starlette.responses import PlainTextResponse, Response

from mocker.api.dependencies import State

__all__ = ["router"]

router = APIRouter(prefix="/v1")


class LoadLoraAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoraAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


@router.post("/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraAdapterRequest, state: State) -> Response:
    message = state.serving.loras.load(body.lora_name, body.lora_path, in_place=body.load_inplace)
    for engine in state.engines:  # into every rank's CPU cache, as vLLM loads it
        engine.preload_lora(body.lora_name)
    return PlainTextResponse(message)


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, state: State) -> Response:
    return PlainTextResponse(state.serving.loras.unload(body.lora_name))
