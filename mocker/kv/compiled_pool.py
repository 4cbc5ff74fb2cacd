"""The compiled device pool (mocker/kv/_cpool.c), when it was built and the config lets it serve.

A replay's per-block work in the Python pool is bound by memory (block objects, int objects
and a map as large as the pool, touched in the order the LRU scatters them); the compiled
pool keeps the same state in packed arrays. It serves what most runs are: a dense model,
LRU eviction, no KV events, no tier below the device, no P/D. Everything else, and every
run with `MOCKER_KV_POOL=python`, uses the Python pool, which stays the reference: the
compiled one does the same operations in the same order (tests/kv/test_compiled_pool.py).
Its blocks are their ids (ints) rather than `KVBlock` objects.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import TYPE_CHECKING

from mocker.config import EngineConfig, EvictionPolicyName, KVRole
from mocker.kv.events import KVEvent

__all__ = ["CompiledBlockPool", "PoolImpl", "compiled_available", "pool_impl", "serves"]

if TYPE_CHECKING:
    from mocker.kv._cpool import Pool as _Pool

    _BUILT = True
else:
    try:
        from mocker.kv._cpool import Pool as _Pool

        _BUILT = True
    except ImportError:  # built without a C compiler: the Python pool serves every run
        _Pool, _BUILT = object, False

# Set to choose: `auto` (the compiled pool where it can serve, else Python), `python`, or
# `compiled` (an error when it was not built).
POOL_ENV = "MOCKER_KV_POOL"


class PoolImpl(StrEnum):
    AUTO = "auto"
    PYTHON = "python"
    COMPILED = "compiled"


def compiled_available() -> bool:
    return _BUILT


def pool_impl() -> PoolImpl:
    raw = os.environ.get(POOL_ENV, PoolImpl.AUTO.value).strip().lower() or PoolImpl.AUTO.value
    try:
        impl = PoolImpl(raw)
    except ValueError:
        choices = ", ".join(p.value for p in PoolImpl)
        raise ValueError(f"{POOL_ENV}={raw!r}: expected one of {choices}") from None
    if impl is PoolImpl.COMPILED and not compiled_available():
        raise RuntimeError(
            f"{POOL_ENV}=compiled, but mocker.kv._cpool was not built (no C compiler when "
            "mocker was installed?): reinstall with one, or use auto / python"
        )
    return impl


def serves(config: EngineConfig, *, with_cpu_tier: bool) -> bool:
    """Whether the compiled pool can serve this engine: what it does not model (events,
    tiers, hybrid groups, lineage eviction, P/D's block ids) sends a run to Python."""
    return (
        not config.is_hybrid
        and not with_cpu_tier
        and not config.enable_kv_cache_events
        and config.eviction_policy is EvictionPolicyName.LRU
        and config.kv_role is KVRole.NONE
    )


class CompiledBlockPool(_Pool):
    """The device pool over packed arrays; blocks are ints (their ids)."""

    __slots__ = ()

    # What the engine asks of every pool and this one never has.
    record_events = False
    keep_tokens = False
    num_displaced = 0
    num_retained_free = 0

    def take_events(self) -> list[KVEvent]:
        return []
