"""`mocker serve --replicas N`: N replicas in one process, replica i on port P+i.

Each replica is a whole server of its own (engine, KV cache, metrics, KV-event sockets,
health and faults), as N `mocker serve` processes would be; they share the process, its
event loop, the tokenizer and one uvicorn server listening on all N ports, which hands
each connection to the replica of the port it came in on."""

from __future__ import annotations

import logging
import resource
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import replace

import zmq
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from mocker.api.app import create_app
from mocker.api.gc_tuning import serving_gc
from mocker.api.state import ServerState
from mocker.config import EngineConfig
from mocker.config_choices import KVRole
from mocker.errors import ConfigError
from mocker.kvevents.config import BIND_PREFIX, binds, offset_endpoint, wildcard_port
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer

__all__ = ["FleetApp", "build_fleet", "check_replicas", "raise_open_files", "replica_settings"]

logger = logging.getLogger("mocker.api.fleet")

# ZMQ sockets beyond the replicas' KV-event ones (libzmq's default cap is 1,023 a context).
_ZMQ_SPARE = 64
# Open files a replica may hold: its listener, its KV-event sockets, and the connections a
# router or load generator keeps open to it.
FILES_PER_REPLICA = 16


def check_replicas(settings: ServerSettings, config: EngineConfig) -> None:
    """Refuse what N replicas in one process cannot be (before anything binds), and make
    room for their ZMQ sockets."""
    replicas = settings.replicas
    if replicas == 1:
        return
    if config.transfer.kv_role is not KVRole.NONE:
        raise ConfigError("--replicas: not with a P/D --kv-transfer-config (a replica would "
                          "need an engine id and side channel of its own)")  # fmt: skip
    if config.offload.lmcache_api is not None:
        raise ConfigError("--replicas: not with LMCache's internal API server "
                          "(internal_api_server_enabled): its ports are one process's")  # fmt: skip
    kv = settings.kv_events
    if not kv.active:
        return
    ranks = replicas * settings.data_parallel_size
    if binds(kv.endpoint):
        # Replica i's data-parallel rank r publishes where rank i * dp + r would.
        kv.check_ranks(ranks)
    elif "{port}" not in kv.topic:
        logger.warning("--replicas %d dial one kv_events_config.endpoint %s: their events are "
                       "told apart by topic, and the topic %r names no {port}", replicas,
                       kv.endpoint, kv.topic)  # fmt: skip
    _check_port_overlap(settings, ranks)
    sockets = ranks * (1 + (kv.replay_endpoint is not None))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    if ctx.get(zmq.MAX_SOCKETS) < sockets + _ZMQ_SPARE:
        ctx.set(zmq.MAX_SOCKETS, sockets + _ZMQ_SPARE)


def _bound_ports(endpoint: str | None, count: int) -> range | None:
    """The tcp ports `count` ranks bind from `endpoint`, if it names them."""
    if endpoint is None or not binds(endpoint) or wildcard_port(endpoint):
        return None
    plain = endpoint.removeprefix(BIND_PREFIX)
    if not plain.startswith("tcp://"):
        return None
    first = int(plain.rpartition(":")[2])
    return range(first, first + count)


def _check_port_overlap(settings: ServerSettings, ranks: int) -> None:
    """The replicas' HTTP ports and their bound KV-event ports must not meet."""
    if not settings.port:
        return
    http = range(settings.port, settings.port + settings.replicas)
    kv = settings.kv_events
    for key, endpoint in (("endpoint", kv.endpoint), ("replay_endpoint", kv.replay_endpoint)):
        bound = _bound_ports(endpoint, ranks)
        if bound is not None and bound.start < http.stop and http.start < bound.stop:
            raise ConfigError(
                f"--replicas {settings.replicas}: HTTP ports {http.start}-{http.stop - 1} and "
                f"kv_events_config.{key} ports {bound.start}-{bound.stop - 1} overlap; move one"
            )


def replica_settings(settings: ServerSettings, index: int, port: int) -> ServerSettings:
    """Replica `index`'s settings: its port, and the KV-event sockets it binds past the ranks
    of the replicas before it (as the data-parallel ranks of one server are). An endpoint it
    dials (a consumer binds it) is every replica's, as for N processes of the same flags."""
    if index == 0:
        return replace(settings, port=port)
    shift = index * settings.data_parallel_size
    kv = settings.kv_events
    endpoint = offset_endpoint(kv.endpoint, shift) if binds(kv.endpoint) else kv.endpoint
    replay = kv.replay_endpoint
    moved = replace(
        kv,
        endpoint=endpoint,
        replay_endpoint=None if replay is None else offset_endpoint(replay, shift),
    )
    return replace(settings, port=port, kv_events=moved)


def raise_open_files(replicas: int) -> None:
    """Lift the soft open-files limit toward the hard one for N replicas (as vLLM lifts it at
    start-up); refuse N the hard limit cannot hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 64 + FILES_PER_REPLICA * replicas
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < need:
            raise ConfigError(f"--replicas {replicas}: needs about {need} open files; the "
                              f"hard limit is {hard} (ulimit -Hn)")  # fmt: skip


class FleetApp:
    """The ASGI app of N replicas: a connection goes to the replica of its local port; the
    lifespan starts every replica's and stops them all."""

    def __init__(self, apps: dict[int, FastAPI], states: Sequence[ServerState]) -> None:
        self.apps = apps
        self.states = states

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        server = scope.get("server")
        app = self.apps.get(server[1]) if server else None
        if app is None:  # cannot happen for a socket uvicorn was given
            raise RuntimeError(f"no replica serves {server}")
        await app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        async with AsyncExitStack() as stack:
            try:
                for app in self.apps.values():
                    await stack.enter_async_context(app.router.lifespan_context(app))
            except BaseException as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                raise
            # Every replica built and started: frozen out of the collector's walks at once.
            stack.enter_context(serving_gc())
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
            assert message["type"] == "lifespan.shutdown"
            # Every replica is stopped on the way out, each whatever the others raise.
            try:
                await stack.aclose()
            except BaseException as exc:
                await send({"type": "lifespan.shutdown.failed", "message": str(exc)})
                raise
        await send({"type": "lifespan.shutdown.complete"})


def build_fleet(
    settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer, ports: list[int]
) -> FleetApp:
    """A replica on each port (replica i on ports[i])."""
    apps: dict[int, FastAPI] = {}
    states: list[ServerState] = []
    for index, port in enumerate(ports):
        app = create_app(replica_settings(settings, index, port), config, tokenizer,
                         tune_gc=False)  # fmt: skip
        apps[port] = app
        states.append(app.state.mocker)
    return FleetApp(apps, states)
