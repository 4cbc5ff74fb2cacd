"""The FastAPI application: vLLM's routes over one live engine, its metrics and its tokenizer."""

from __future__ import annotations

import asyncio
import gc
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mocker import __version__
from mocker.api.errors import OpenAIError, install_error_handlers
from mocker.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    TokenizeRequest,
)
from mocker.api.serving import OpenAIServing
from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.live import EngineDeadError, LiveEngine
from mocker.engine.outputs import StepResult
from mocker.kvevents.config import advertised_host, connectable
from mocker.kvevents.publisher import ZmqEventPublisher
from mocker.metrics import EngineMetrics, EngineSnapshot, MetricsCollector, build_registry
from mocker.options import ServerSettings
from mocker.tokenizer import ChatTemplateError, TextTokenizer

__all__ = ["ServerState", "create_app", "engine_config_for"]


def engine_config_for(config: EngineConfig, tokenizer: TextTokenizer) -> EngineConfig:
    """The engine config with the tokenizer's vocabulary and EOS token."""
    return config.with_changes(vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id)


@dataclass(slots=True)
class ServerState:
    """What the routes share: the engine, its metrics, the tokenizer and the settings."""

    settings: ServerSettings
    config: EngineConfig
    tokenizer: TextTokenizer
    engine: LiveEngine
    metrics: EngineMetrics
    registry: CollectorRegistry
    serving: OpenAIServing
    created: int
    publisher: ZmqEventPublisher | None = None
    # Set on SIGTERM (mocker.api.shutdown): new work and /health get 503 while in-flight
    # requests finish.
    draining: bool = False


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def build_state(
    settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer
) -> ServerState:
    config = engine_config_for(config, tokenizer)
    events = settings.kv_events
    if events.active and not config.enable_kv_cache_events:
        config = config.with_changes(enable_kv_cache_events=True)
    core = EngineCore(config, output_palette=tokenizer.palette)
    metrics = EngineMetrics(config, engine="0")
    publisher = None
    on_step = metrics.on_step
    if events.active:
        topic = events.topic_for(
            host=advertised_host(settings.host), port=settings.port, model=settings.model_name
        )
        publisher = ZmqEventPublisher(events, topic=topic, rank=0, fmt=settings.kv_events_format)
        on_step = _publishing(metrics.on_step, publisher)
    engine = LiveEngine(core, on_step=on_step, on_finish=metrics.on_finish)
    host = core.host
    metrics.snapshot = lambda: EngineSnapshot(
        engine.num_running,
        engine.num_waiting,
        core.pool.usage,
        host.usage if host is not None else 0.0,
    )
    metrics.lookup = core.requests.get
    collector = MetricsCollector(
        [metrics], settings.model_name, legacy_names=settings.legacy_metric_names
    )
    return ServerState(
        settings=settings,
        config=config,
        tokenizer=tokenizer,
        engine=engine,
        metrics=metrics,
        registry=build_registry(collector),
        serving=OpenAIServing(engine, tokenizer, settings, config),
        created=int(time.time()),
        publisher=publisher,
    )


def _publishing(
    observe: Callable[[StepResult], None], publisher: ZmqEventPublisher
) -> Callable[[StepResult], None]:
    """The step observer that also publishes each step's KV events as one batch."""
    publish = publisher.publish

    def on_step(result: StepResult) -> None:
        observe(result)
        if result.kv_events:
            publish(result.kv_events)

    return on_step


def kv_event_sources(state: ServerState) -> dict[str, object]:
    """Where a consumer subscribes to this server's KV events (GET /kv_event_sources)."""
    settings, publisher = state.settings, state.publisher
    body: dict[str, object] = {
        "enabled": publisher is not None,
        "publisher": settings.kv_events.publisher if publisher is not None else "null",
        "format": settings.kv_events_format.value,
        "model": settings.model_name,
        "block_size": state.config.block_size,
        "sources": [],
    }
    if publisher is not None:
        host = advertised_host(settings.host)
        replay = publisher.replay_endpoint
        body["sources"] = [
            {
                "data_parallel_rank": publisher.rank,
                "endpoint": publisher.endpoint,
                # bind: subscribe by connecting to `connect`; connect: the engine dials the
                # consumer's own bound socket at `endpoint`.
                "mode": "bind" if publisher.binds else "connect",
                "connect": connectable(publisher.endpoint, host) if publisher.binds else None,
                "replay_endpoint": replay,
                "replay_connect": connectable(replay, host) if replay is not None else None,
                "topic": publisher.topic,
                "next_seq": publisher.next_seq,
            }
        ]
    return body


class _MockerApp(FastAPI):
    """FastAPI that also hands responses the server's own `send` (scope["mocker.send"]).

    Streamed body chunks go to it directly, past the per-message wrappers of the error
    middlewares (they only track whether the response started, which the start message,
    sent through them, already tells them): several microseconds less per token.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["mocker.send"] = send
        await super().__call__(scope, receive, send)


def create_app(settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer) -> FastAPI:
    state = build_state(settings, config, tokenizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        # Everything built so far lives as long as the server (KV blocks, tokenizer tables):
        # keep it out of the cyclic GC's full collections, which otherwise walk those
        # hundreds of thousands of objects and stall every stream for ~100 ms (vLLM does
        # the same after start-up).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await state.engine.stop()
            if state.publisher is not None:
                await asyncio.to_thread(state.publisher.close)

    app = _MockerApp(
        title="mocker",
        version=__version__,
        description="An OpenAI-compatible mock of a vLLM inference engine (no GPU).",
        lifespan=lifespan,
    )
    app.state.mocker = state
    install_error_handlers(app)

    async def require_api_key(authorization: Annotated[str | None, Header()] = None) -> None:
        key = settings.api_key
        if key is None:
            return
        expected = f"Bearer {key}"
        if authorization is None or not secrets.compare_digest(
            authorization.encode(), expected.encode()
        ):
            raise OpenAIError(401, "Unauthorized: a valid API key is required (Bearer token).")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])

    async def accepting() -> None:
        if state.draining:
            raise OpenAIError(503, "The server is shutting down; send the request elsewhere.")

    @v1.post("/completions", dependencies=[Depends(accepting)])
    async def completions(
        body: CompletionRequest,
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        return state.serving.completions(body, x_request_id or None)

    @v1.post("/chat/completions", dependencies=[Depends(accepting)])
    async def chat_completions(
        body: ChatCompletionRequest,
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        return state.serving.chat(body, x_request_id or None)

    @v1.get("/models")
    async def models() -> Response:
        cards = [
            ModelCard(
                id=name,
                created=state.created,
                root=settings.model,
                max_model_len=state.config.max_model_len,
            ).model_dump()
            for name in settings.served_model_names
        ]
        return _json({"object": "list", "data": cards})

    app.include_router(v1)

    def health_response() -> Response:
        if state.engine.is_dead or state.draining:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return health_response()

    @app.get("/ping")
    async def ping() -> Response:
        return health_response()

    @app.post("/ping")
    async def ping_post() -> Response:
        return health_response()

    @app.get("/version")
    async def version() -> Response:
        return _json({"version": __version__})

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        state.serving.check_model(body.model)
        tok = state.tokenizer
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "Give exactly one of 'prompt' or 'messages'.", "prompt")
        if body.messages is not None:
            messages = [state.serving.message_dict(m, i) for i, m in enumerate(body.messages)]
            try:
                text = tok.render_chat(messages, add_generation_prompt=body.add_generation_prompt)
            except ChatTemplateError as exc:
                raise OpenAIError(400, str(exc), "messages") from None
            ids = tok.encode(
                text,
                add_special_tokens=bool(body.add_special_tokens)
                if body.add_special_tokens is not None
                else tok.chat_template is None,
            )
        else:
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = tok.encode(body.prompt or "", add_special_tokens=add)
        strs = [tok.id_to_token(t) for t in ids] if body.return_token_strs else None
        return _json(
            {
                "count": len(ids),
                "max_model_len": state.config.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        state.serving.check_model(body.model)
        state.serving.check_token_ids(body.tokens, "tokens")
        return _json({"prompt": state.tokenizer.decode(body.tokens)})

    @app.get("/kv_event_sources")
    async def event_sources() -> Response:
        return _json(kv_event_sources(state))

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        try:
            cleared = await state.engine.reset_prefix_cache()
        except EngineDeadError as exc:
            raise OpenAIError(503, f"The engine is not running: {exc}") from None
        return _json({"cleared_blocks": cleared})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    return app
