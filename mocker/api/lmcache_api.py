"""LMCache's internal API server (its `internal_api_server_enabled`): the door to its metrics,
one listener per LMCache process of data-parallel rank 0."""

from __future__ import annotations

import asyncio
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_wsgi_server

from mocker.config import ConfigError
from mocker.metrics.lmcache import LMCacheCollector
from mocker.tiers import lmcache_stats
from mocker.tiers.connector import TierConnector

__all__ = ["LMCacheApi"]


class LMCacheApi:
    """The scheduler's listener at the first port (its families without samples) and the
    worker's at the next (what the engine's LMCache counted), each `/metrics` served by
    prometheus_client's own threaded server, bound at construction; and LMCache's stats
    logger, flushing the worker's counts every 10 seconds on the engine's loop."""

    def __init__(
        self, host: str, first_port: int, connector: TierConnector, model: str, served: str
    ) -> None:
        assert connector.lmcache is not None
        self._connector = connector
        self.host = host
        self._flusher: asyncio.Task[None] | None = None
        self.servers: list[WSGIServer] = []
        roles = (("scheduler", None), ("worker", connector.lmcache))
        try:
            for offset, (role, role_stats) in enumerate(roles):
                registry = CollectorRegistry(auto_describe=True)
                registry.register(LMCacheCollector(role_stats, (model, "0", role, served)))
                port = first_port + offset if first_port else 0  # (0: the system picks)
                try:
                    server, _ = start_wsgi_server(port, host, registry)
                except OSError as exc:
                    raise ConfigError(
                        f"cannot bind LMCache's internal API server ({role}) to {host}:{port}: "
                        f"{exc.strerror or exc}"
                    ) from None
                self.servers.append(server)
        except BaseException:
            self.close_now()
            raise

    @property
    def ports(self) -> list[int]:
        """The scheduler's port, then the worker's."""
        return [server.server_port for server in self.servers]

    @property
    def urls(self) -> list[str]:
        """The scheduler's metrics, then the worker's."""
        return [f"http://{self.host}:{port}/metrics" for port in self.ports]

    def start(self) -> None:
        """The stats logger starts (on the running loop): a flush now, then every 10 s."""
        self._flusher = asyncio.get_running_loop().create_task(self._flush_every())

    async def _flush_every(self) -> None:
        while True:
            self._connector.flush_lmcache()
            await asyncio.sleep(lmcache_stats.LMCACHE_FLUSH_S)

    def close_now(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        self.servers = []

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        await asyncio.to_thread(self.close_now)
