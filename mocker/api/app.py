"""The FastAPI application: the server state, its lifespan, and the routers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

from fastapi import Depends, FastAPI

from mocker import __version__
from mocker.api.auth import require_api_key
from mocker.api.direct_routes import DirectRoutes
from mocker.api.errors import install_error_handlers
from mocker.api.gc_tuning import serving_gc
from mocker.api.lora import runtime_updates_allowed
from mocker.api.openapi import describe_openapi
from mocker.api.raw_send import RawSendApp
from mocker.api.routes import admin, discovery, inference, lora, openai, operations
from mocker.api.routes import sleep as sleep_routes
from mocker.api.routes import tokenizer as tokenizer_routes
from mocker.api.state import ServerState, build_state
from mocker.config import EngineConfig
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer

__all__ = ["create_app"]

logger = logging.getLogger("uvicorn.error")


def _lifespan(
    state: ServerState, *, tune_gc: bool = True
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the engines; on the way out stop them and close the KV-event publishers and the
    P/D side channels. `tune_gc` False: the collector is left as it is (the replicas of one
    process tune it once, around them all)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.engines.start()
        for channel in state.side_channels:
            channel.start()
        if state.lmcache_api is not None:
            state.lmcache_api.start()
            scheduler, worker = state.lmcache_api.urls
            logger.info("LMCache metrics: scheduler at %s, worker at %s", scheduler, worker)
        delay = state.settings.startup_delay
        if delay > 0:
            state.ready_at = asyncio.get_running_loop().time() + delay
            logger.info("start-up delay: /health and completions answer 503 for %.1f s", delay)
        # Start-up objects frozen out of the cyclic GC, young collections rare (gc_tuning).
        with serving_gc() if tune_gc else nullcontext():
            try:
                yield
            finally:
                await state.engines.stop()
                for channel in state.side_channels:
                    await channel.close()
                for publisher in state.publishers:
                    await asyncio.to_thread(publisher.close)
                if state.lmcache_api is not None:
                    await state.lmcache_api.close()

    return lifespan


def create_app(
    settings: ServerSettings,
    config: EngineConfig,
    tokenizer: TextTokenizer,
    *,
    tune_gc: bool = True,
) -> FastAPI:
    state = build_state(settings, config, tokenizer)
    app = RawSendApp(
        title="mocker",
        version=__version__,
        description="An OpenAI-compatible mock of a vLLM inference engine (no GPU).",
        lifespan=_lifespan(state, tune_gc=tune_gc),
    )
    app.state.mocker = state
    app.direct = DirectRoutes(state)
    install_error_handlers(app)
    describe_openapi(app, settings, config, tokenizer)
    # The API key check only when one is set: a dependency costs every request its solving.
    auth = [Depends(require_api_key)] if settings.api_key else []
    app.include_router(openai.router, dependencies=auth)
    app.include_router(inference.router, dependencies=auth)
    if config.lora.enable_lora and runtime_updates_allowed():
        app.include_router(lora.router, dependencies=auth)
    app.include_router(tokenizer_routes.router)
    app.include_router(operations.router)
    app.include_router(discovery.router)
    if settings.admin_token:
        app.include_router(admin.router)
    if sleep_routes.dev_mode():
        logger.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT "
                       "be used in production!")  # fmt: skip
        app.include_router(sleep_routes.router)
    return app
