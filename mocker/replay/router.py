"""Routing policies for replay across several engines: round-robin, least-loaded, kv-aware."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from mocker.engine.core import EngineCore
from mocker.engine.stats import queue_score
from mocker.kv.hashing import BlockHash

__all__ = ["Router", "RoutingPolicy", "make_router"]


class RoutingPolicy(StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"  # lowest queue score: 4 × waiting + running, as vLLM
    KV_AWARE = "kv-aware"  # most cached prefix blocks on the device, ties to least loaded


class Router(Protocol):
    def pick(self, cores: Sequence[EngineCore], block_hashes: Sequence[BlockHash]) -> int: ...


def _load(core: EngineCore) -> int:
    """The data-parallel group's score (mocker.engine.stats.queue_score)."""
    return queue_score(core.num_waiting, core.num_running)


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
        def key(i: int) -> tuple[int, int, int]:
            core = cores[i]
            return (-core.num_cached_prefix_blocks(block_hashes), _load(core), i)

        return min(range(len(cores)), key=key)


def make_router(policy: RoutingPolicy | str) -> Router:
    policy = RoutingPolicy(policy)
    if policy is RoutingPolicy.ROUND_ROBIN:
        return _RoundRobin()
    if policy is RoutingPolicy.LEAST_LOADED:
        return _LeastLoaded()
    return _KVAware()
