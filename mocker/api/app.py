"""The FastAPI application: vLLM's routes over one live engine, its metrics and its tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from mocker import __version__
from mocker.api.errors import OpenAIError, error_response, install_error_handlers
from mocker.api.faults import FaultInjector
from mocker.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    TokenizeRequest,
)
from mocker.api.serving import OpenAIServing, RequestHeaders
from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.group import EngineGroup
from mocker.engine.live import EngineDeadError, LiveEngine
from mocker.engine.outputs import StepResult
from mocker.kvevents.config import advertised_host, connectable
from mocker.kvevents.publisher import ZmqEventPublisher
from mocker.metrics import EngineMetrics, EngineSnapshot, MetricsCollector, build_registry
from mocker.settings import ServerSettings
from mocker.tokenizer import ChatTemplateError, TextTokenizer

__all__ = ["ServerState", "create_app", "engine_config_for"]

logger = logging.getLogger("uvicorn.error")


def engine_config_for(config: EngineConfig, tokenizer: TextTokenizer) -> EngineConfig:
    """The engine config with the tokenizer's vocabulary and EOS token."""
    return config.with_changes(vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id)


@dataclass(slots=True)
class ServerState:
    """What the routes share: the engines, their metrics, the tokenizer and the settings."""

    settings: ServerSettings
    config: EngineConfig
    tokenizer: TextTokenizer
    engines: EngineGroup  # one per data-parallel rank
    metrics: list[EngineMetrics]  # by rank
    registry: CollectorRegistry
    serving: OpenAIServing
    faults: FaultInjector
    created: int
    publishers: list[ZmqEventPublisher] = field(default_factory=list)  # by rank, if enabled
    # Set on SIGTERM (mocker.api.shutdown): new work and /health get 503 while in-flight
    # requests finish.
    draining: bool = False
    # Until then (event-loop time) /health and completions get 503: --startup-delay.
    ready_at: float = 0.0

    @property
    def in_flight(self) -> int:
        """Accepted generation requests whose response has not ended (output held back by
        jitter included): what a drain waits for."""
        return self.serving.open_responses

    @property
    def starting(self) -> bool:
        return asyncio.get_running_loop().time() < self.ready_at


async def _request_headers(
    x_request_id: Annotated[str | None, Header()] = None,
    x_data_parallel_rank: Annotated[str | None, Header()] = None,
    x_mocker_fail: Annotated[str | None, Header()] = None,
) -> RequestHeaders:
    return RequestHeaders(x_request_id or None, x_data_parallel_rank, x_mocker_fail)


# The headers a generation route reads, as one dependency.
_Headers = Annotated[RequestHeaders, Depends(_request_headers)]


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _rank_engine(
    settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer, rank: int
) -> tuple[LiveEngine, EngineMetrics, ZmqEventPublisher | None]:
    """Data-parallel rank `rank`: its core and loop, its metrics, its KV-event publisher."""
    core = EngineCore(config, output_palette=tokenizer.palette)
    metrics = EngineMetrics(config, engine=str(rank))
    publisher = None
    on_step = metrics.on_step
    events = settings.kv_events
    if events.active:
        topic = events.topic_for(
            host=advertised_host(settings.host), port=settings.port, model=settings.model_name
        )
        publisher = ZmqEventPublisher(events, topic=topic, rank=rank, fmt=settings.kv_events_format)
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
    return engine, metrics, publisher


def build_state(
    settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer
) -> ServerState:
    config = engine_config_for(config, tokenizer)
    if settings.kv_events.active and not config.enable_kv_cache_events:
        config = config.with_changes(enable_kv_cache_events=True)
    if settings.kv_events.active:
        settings.kv_events.check_ranks(settings.data_parallel_size)
    engines: list[LiveEngine] = []
    metrics: list[EngineMetrics] = []
    publishers: list[ZmqEventPublisher] = []
    try:
        for rank in range(settings.data_parallel_size):
            engine, rank_metrics, publisher = _rank_engine(settings, config, tokenizer, rank)
            engines.append(engine)
            metrics.append(rank_metrics)
            if publisher is not None:
                publishers.append(publisher)
    except BaseException:
        for publisher in publishers:  # e.g. rank 1's port is taken: free rank 0's
            publisher.close()
        raise
    group = EngineGroup(engines)
    faults = FaultInjector(settings.faults, seed=config.seed)
    collector = MetricsCollector(
        metrics,
        settings.model_name,
        legacy_names=settings.legacy_metric_names,
        failures=faults.counts,
    )
    return ServerState(
        settings=settings,
        config=config,
        tokenizer=tokenizer,
        engines=group,
        metrics=metrics,
        registry=build_registry(collector),
        serving=OpenAIServing(group, tokenizer, settings, config, faults),
        faults=faults,
        created=int(time.time()),
        publishers=publishers,
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
    settings, publishers = state.settings, state.publishers
    body: dict[str, object] = {
        "enabled": bool(publishers),
        "publisher": settings.kv_events.publisher if publishers else "null",
        "format": settings.kv_events_format.value,
        "model": settings.model_name,
        "block_size": state.config.block_size,
        "data_parallel_size": len(state.engines),
        "sources": [],
    }
    host = advertised_host(settings.host)
    body["sources"] = [
        {
            "data_parallel_rank": publisher.rank,
            "endpoint": publisher.endpoint,
            # bind: subscribe by connecting to `connect`; connect: the engine dials the
            # consumer's own bound socket at `endpoint`.
            "mode": "bind" if publisher.binds else "connect",
            "connect": connectable(publisher.endpoint, host) if publisher.binds else None,
            "replay_endpoint": publisher.replay_endpoint,
            "replay_connect": connectable(publisher.replay_endpoint, host)
            if publisher.replay_endpoint is not None
            else None,
            "topic": publisher.topic,
            "next_seq": publisher.next_seq,
        }
        for publisher in publishers
    ]
    return body


class _MockerApp(FastAPI):
    """FastAPI that also hands responses the server's own `send` (scope["mocker.send"]).

    Streamed body chunks go to it directly, past the per-message wrappers of the error
    middlewares (they only track whether the response started, which the start message,
    sent through them, already tells them): several microseconds less per token.
    """

    mocker: ServerState

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["mocker.send"] = send
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        started = False

        async def send_start(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await super().__call__(scope, receive, send_start)
        except asyncio.CancelledError:
            if not self.mocker.draining:
                raise
            # After a drain, uvicorn cancels what is still running once its graceful timeout
            # has passed (say, a client stalled mid-upload): end it with a 503 rather than the
            # traceback uvicorn would log for the cancellation.
            if not started:
                with contextlib.suppress(Exception):
                    reply = error_response(503, "The server is shutting down.")
                    await reply(scope, receive, send)


def create_app(settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer) -> FastAPI:
    state = build_state(settings, config, tokenizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.engines.start()
        if settings.startup_delay > 0:
            state.ready_at = asyncio.get_running_loop().time() + settings.startup_delay
            logger.info(
                "start-up delay: /health and completions answer 503 for %.1f s",
                settings.startup_delay,
            )
        # Everything built so far lives as long as the server (KV blocks, tokenizer tables):
        # keep it out of the cyclic GC's full collections, which otherwise walk those
        # hundreds of thousands of objects and stall every stream for ~100 ms (vLLM does
        # the same after start-up).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await state.engines.stop()
            for publisher in state.publishers:
                await asyncio.to_thread(publisher.close)

    app = _MockerApp(
        title="mocker",
        version=__version__,
        description="An OpenAI-compatible mock of a vLLM inference engine (no GPU).",
        lifespan=lifespan,
    )
    app.state.mocker = app.mocker = state
    install_error_handlers(app)

    def bearer(token: str, what: str) -> Callable[..., Awaitable[None]]:
        """A dependency requiring 'Authorization: Bearer <token>'."""
        expected = f"Bearer {token}".encode()

        async def check(authorization: Annotated[str | None, Header()] = None) -> None:
            if authorization is None or not secrets.compare_digest(
                authorization.encode(), expected
            ):
                raise OpenAIError(401, f"Unauthorized: a valid {what} is required (Bearer token).")

        return check

    v1_auth = [Depends(bearer(settings.api_key, "API key"))] if settings.api_key else []
    v1 = APIRouter(prefix="/v1", dependencies=v1_auth)

    async def accepting() -> None:
        if state.draining:
            raise OpenAIError(503, "The server is shutting down; send the request elsewhere.")
        if state.starting:
            raise OpenAIError(503, "The server is starting up (--startup-delay); retry shortly.")

    @v1.post("/completions", dependencies=[Depends(accepting)])
    async def completions(body: CompletionRequest, headers: _Headers) -> Response:
        return state.serving.completions(body, headers)

    @v1.post("/chat/completions", dependencies=[Depends(accepting)])
    async def chat_completions(body: ChatCompletionRequest, headers: _Headers) -> Response:
        return state.serving.chat(body, headers)

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
        if state.engines.is_dead or state.draining or state.starting:
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
            cleared = await state.engines.reset_prefix_cache()
        except EngineDeadError as exc:
            raise OpenAIError(503, f"The engine is not running: {exc}") from None
        return _json({"cleared_blocks": cleared})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    if settings.admin_token:
        admin = APIRouter(
            prefix="/admin", dependencies=[Depends(bearer(settings.admin_token, "admin token"))]
        )

        @admin.get("/config")
        async def admin_config() -> Response:
            return _json(state.faults.config.as_json())

        @admin.post("/config")
        async def admin_set_config(request: Request) -> Response:
            try:
                changes = orjson.loads(await request.body())
            except orjson.JSONDecodeError as exc:
                raise OpenAIError(400, f"the request body is not valid JSON: {exc}") from None
            if not isinstance(changes, dict):
                raise OpenAIError(400, "the request body must be a JSON object of settings")
            try:
                state.faults.config = state.faults.config.with_changes(changes)
            except (TypeError, ValueError) as exc:
                raise OpenAIError(400, str(exc)) from None
            logger.info("admin: fault settings now %s", state.faults.config.as_json())
            return _json(state.faults.config.as_json())

        app.include_router(admin)

    return app
