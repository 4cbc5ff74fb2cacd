"""The composition root: engines, metrics, KV-event publishers and serving, built from settings."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mocker.api.errors import OpenAIError
from mocker.api.faults import FaultInjector
from mocker.api.lmcache_api import LMCacheApi
from mocker.api.lora import LoraAdapters
from mocker.api.serving import OpenAIServing
from mocker.config import ConfigError, EngineConfig
from mocker.config_choices import KVRole
from mocker.disagg.pulls import PdCounters
from mocker.disagg.side_channel import SideChannelClient, SideChannelServer
from mocker.engine.core import EngineCore
from mocker.engine.group import EngineGroup
from mocker.engine.kv_stack import build_shared_tiers
from mocker.engine.live import LiveEngine
from mocker.engine.outputs import StepResult
from mocker.kvevents.config import advertised_host
from mocker.kvevents.publisher import ZmqEventPublisher
from mocker.kvevents.wire import Dialect
from mocker.metrics import Exposition, MetricsCollector, StatsRecorder
from mocker.metrics.sources import admission_counts
from mocker.settings import ServerSettings
from mocker.tiers.storage import StorageTier
from mocker.tokenizer import TextTokenizer

__all__ = ["ServerState", "build_state", "engine_config_for"]


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
    metrics: list[StatsRecorder]  # by rank
    exposition: Exposition  # the /metrics body
    serving: OpenAIServing
    faults: FaultInjector
    created: int
    publishers: list[ZmqEventPublisher] = field(default_factory=list)  # by rank, if enabled
    # P/D: the NIXL side channels of the ranks (prefill: served; decode: notifications).
    side_channels: list[SideChannelServer | SideChannelClient] = field(default_factory=list)
    # LMCache's internal API server (rank 0's LMCache), when its config enables it.
    lmcache_api: LMCacheApi | None = None
    # Set on SIGTERM (mocker.api.shutdown): new work and /health get 503 while in-flight
    # requests finish.
    draining: bool = False
    # Until then (event-loop time) /health and completions get 503: --startup-delay.
    ready_at: float = 0.0
    # This server's identity in routers' indexes (vLLM's VllmConfig.instance_id).
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def in_flight(self) -> int:
        """Accepted generation requests whose response has not ended (output held back by
        jitter included): what a drain waits for."""
        return self.serving.open_responses

    @property
    def starting(self) -> bool:
        return asyncio.get_running_loop().time() < self.ready_at


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


def _rank_engine(
    settings: ServerSettings,
    config: EngineConfig,
    tokenizer: TextTokenizer,
    rank: int,
    shared: Mapping[str, StorageTier],
) -> tuple[LiveEngine, StatsRecorder, ZmqEventPublisher | None]:
    """Data-parallel rank `rank`: its core and loop, its metrics, its KV-event publisher.
    `shared`: the process's tiers every rank uses (one `obj`)."""
    if config.transfer.kv_role is not KVRole.NONE and settings.data_parallel_size > 1:
        # vLLM's engine id per data-parallel rank.
        config = config.with_changes(kv_engine_id=f"{config.transfer.kv_engine_id}_dp{rank}")
    core = EngineCore(config, output_palette=tokenizer.palette, shared_tiers=shared, engine_id=rank)
    if core.lora is not None:  # --lora-modules are loaded at start-up, as vLLM loads them
        core.lora.preload(m.name for m in settings.lora_modules)
    metrics = StatsRecorder(config, engine=str(rank), release=settings.vllm_compat)
    publisher = None
    on_step: Callable[[StepResult], None] = metrics.on_step
    events = settings.kv_events
    if events.active:
        topic = events.topic_for(
            host=advertised_host(settings.host), port=settings.port, model=settings.model_name
        )
        dialect = Dialect.vllm(settings.vllm_compat, config.offload.self_describing_kv_events)
        publisher = ZmqEventPublisher(
            events,
            topic=topic,
            rank=rank,
            fmt=settings.kv_events_format,
            dialect=dialect,
            full_hashes=not config.cache.int_block_hashes,
        )
        on_step = _publishing(metrics.on_step, publisher)
    engine = LiveEngine(
        core,
        on_step=on_step,
        on_finish=metrics.on_finish,
        max_merged_passes=settings.max_merged_passes,
    )
    metrics.snapshot = engine.snapshot
    return engine, metrics, publisher


def side_channels(
    engine: LiveEngine, rank: int, counters: PdCounters
) -> list[SideChannelServer | SideChannelClient]:
    """A P/D rank's NIXL side channel: a prefill engine serves one at
    VLLM_NIXL_SIDE_CHANNEL_HOST : VLLM_NIXL_SIDE_CHANNEL_PORT + rank (vLLM's defaults:
    localhost, 5600; port 0 binds any free port, which kv_transfer_params then name); a
    decode engine sends its notifications through a client."""
    core = engine.core
    channels: list[SideChannelServer | SideChannelClient] = []
    if core.holds is not None:
        host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
        raw = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")
        try:
            base = int(raw)
        except ValueError:
            base = -1
        # Each rank listens on base + rank: the highest must be a port too.
        last = base + rank if base > 0 else base
        if not 0 <= last <= 65535:
            raise ConfigError(
                f"VLLM_NIXL_SIDE_CHANNEL_PORT={raw!r} is not a port number (0-65535 with the "
                "rank added; 0: any free port)"
            )
        server = SideChannelServer(engine, host, base + rank if base else 0, counters)
        core.side_channel = (host, server.port)
        channels.append(server)
    if core.pulls is not None:
        client = SideChannelClient(engine, counters)
        core.pulls.peers = client
        channels.append(client)
    return channels


def lora_adapters(settings: ServerSettings, config: EngineConfig) -> LoraAdapters:
    """The --lora-modules adapters (they need --enable-lora, as in vLLM)."""
    if settings.lora_modules and not config.lora.enable_lora:
        raise ConfigError("--lora-modules needs --enable-lora")
    try:
        return LoraAdapters(settings)
    except OpenAIError as exc:
        raise ConfigError(f"--lora-modules: {exc.message}") from None


def build_state(
    settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer
) -> ServerState:
    config = engine_config_for(config, tokenizer)
    if settings.kv_events.active and not config.cache.enable_kv_cache_events:
        config = config.with_changes(enable_kv_cache_events=True)
    if settings.kv_events.active:
        settings.kv_events.check_ranks(settings.data_parallel_size)
    engines: list[LiveEngine] = []
    metrics: list[StatsRecorder] = []
    publishers: list[ZmqEventPublisher] = []
    channels: list[SideChannelServer | SideChannelClient] = []
    loras = lora_adapters(settings, config)  # before any socket is bound
    shared = build_shared_tiers(config)
    try:
        for rank in range(settings.data_parallel_size):
            engine, rank_metrics, publisher = _rank_engine(
                settings, config, tokenizer, rank, shared
            )
            engines.append(engine)
            metrics.append(rank_metrics)
            if publisher is not None:
                publishers.append(publisher)
            channels += side_channels(engine, rank, rank_metrics.pd)
        lmcache_api = _lmcache_api(settings, config, engines[0])
    except BaseException:
        for publisher in publishers:  # e.g. rank 1's port is taken: free rank 0's
            publisher.close()
        for channel in channels:
            channel.close_now()
        raise
    group = EngineGroup(engines)
    faults = FaultInjector(settings.faults, seed=config.seed)
    rejections = admission_counts()
    collector = MetricsCollector(
        metrics, settings.model_name, legacy_names=settings.legacy_metric_names,
        failures=faults.counts, rejections=rejections,
    )  # fmt: skip
    return ServerState(
        settings=settings,
        config=config,
        tokenizer=tokenizer,
        engines=group,
        metrics=metrics,
        exposition=Exposition(collector),
        serving=OpenAIServing(group, tokenizer, settings, config, faults, loras, rejections),
        faults=faults,
        created=int(time.time()),
        publishers=publishers,
        side_channels=channels,
        lmcache_api=lmcache_api,
    )


def _lmcache_api(
    settings: ServerSettings, config: EngineConfig, engine: LiveEngine
) -> LMCacheApi | None:
    """Rank 0's LMCache metrics door, if LMCache's config opens it."""
    where = config.offload.lmcache_api
    connector = engine.core.connector
    if where is None or connector is None or connector.lmcache is None:
        return None
    host, port = where
    return LMCacheApi(host, port, connector, settings.model, settings.model_name)
