"""Routing policies for replay across several engines: round-robin, least-loaded, kv-aware."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from mocker.engine.core import EngineCore
from mocker.kv.hashing import BlockHash

__all__ = ["Router", "RoutingPolicy", "make_router"]


class RoutingPolicy(StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    KV_AWARE = "kv-aware"  # most cached prefix blocks on the device, ties to least loaded


class Router(Protocol):
    def pick(self, cores: Sequence[EngineCore], block_hashes: Sequence[BlockHash]) -> int: ...


def _load(core: EngineCore) -> int:
    return core.num_running + core.num_waiting


class _RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def pick(self, cores: Sequence[EngineCore], block_hashes: Sequence[BlockHash]) -> int:
        i = self._next % len(cores)
        self._next += 1
        return i


class _LeastLoaded:
    def pick(self, cores: Sequence[EngineCore], block_hashes: Sequence[BlockHash]) -> int:
        return min(range(len(cores)), key=lambda i: (_load(cores[i]), i))


class _KVAware:
    def pick(self, cores: Sequence[EngineCore], block_hashes: Sequence[BlockHash]) -> int:
        def cached(core: EngineCore) -> int:
            lookup = core.pool.lookup
            n = 0
            for h in block_hashes:
                if lookup(h) is None:
                    break
                n += 1
            return n

        return min(range(len(cores)), key=lambda i: (-cached(cores[i]), _load(cores[i]), i))


def make_router(policy: RoutingPolicy | str) -> Router:
    policy = RoutingPolicy(policy)
    if policy is RoutingPolicy.ROUND_ROBIN:
        return _RoundRobin()
    if policy is RoutingPolicy.LEAST_LOADED:
        return _LeastLoaded()
    return _KVAware()
