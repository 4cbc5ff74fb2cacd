"""What LMCache's worker counts (its LMCStatsMonitor), and its flush every 10 seconds into the
values its Prometheus families show (lmcache/observability.py, LMCache 0.5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

__all__ = ["LMCACHE_FLUSH_S", "LMCacheCounts", "LMCacheStats"]

LMCACHE_FLUSH_S = 10.0  # its stats logger thread's interval


@dataclass(slots=True)
class LMCacheCounts:
    """LMCache's counters (tokens unless named otherwise)."""

    retrieve_requests: int = 0
    store_requests: int = 0
    lookup_requests: int = 0
    requested_tokens: int = 0
    hit_tokens: int = 0
    stored_tokens: int = 0
    lookup_tokens: int = 0
    lookup_hits: int = 0
    vllm_hit_tokens: int = 0
    prompt_tokens: int = 0

    def add(self, other: LMCacheCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class LMCacheStats:
    """The interval's counts and observations, flushed every LMCACHE_FLUSH_S (by whoever
    serves them; the first at start): the counters then move, the histograms' observations go
    to `on_flush` (the exporter's histograms), the hit-rate gauges take the interval's
    rates, the usage gauges the tiers' bytes."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk = chunk_tokens
        self.interval = LMCacheCounts()
        self.totals = LMCacheCounts()  # as exported
        self.retrieve_hit_rate = 0.0
        self.lookup_hit_rate = 0.0
        self.local_cache_usage = 0  # bytes: the CPU tier's
        self.local_storage_usage = 0  # bytes: the local disk's
        # (histogram, value): observed until the next flush hands them to `on_flush`.
        self._observed: list[tuple[str, float]] = []
        self.on_flush: Callable[[list[tuple[str, float]]], None] | None = None

    def _chunks(self, tokens: int) -> int:
        return tokens - tokens % self.chunk

    def lookup(self, num_tokens: int, hit_tokens: int) -> None:
        """A request's lookup over its tokens; LMCache asks only for whole chunks (none: no
        lookup at all); `hit_tokens`: the chunk-aligned prefix it holds."""
        looked = self._chunks(num_tokens)
        if not looked:
            return
        c = self.interval
        c.lookup_requests += 1
        c.lookup_tokens += looked
        c.lookup_hits += hit_tokens
        if hit_tokens and self.on_flush is not None:  # (of the tokens it asked for)
            self._observed.append(("request_cache_hit_rate", hit_tokens / looked))

    def scheduled(self, vllm_hit: int, scheduled_to: int) -> None:
        """A looked-up request's first pass: vLLM's own hit, and the chunk-aligned tokens it
        will have computed at that pass's end (LMCache's prompt count)."""
        self.interval.vllm_hit_tokens += vllm_hit
        self.interval.prompt_tokens += self._chunks(scheduled_to)

    def retrieve(self, tokens: int, seconds: float) -> None:
        """A request's retrieval: `tokens` read (from the chunk boundary at or before vLLM's
        hit), in `seconds`."""
        c = self.interval
        c.retrieve_requests += 1
        c.requested_tokens += tokens
        c.hit_tokens += tokens
        self._timed("retrieve", tokens, seconds)

    def store(self, tokens: int) -> None:
        """A request's new whole chunks, stored after a pass."""
        self.interval.store_requests += 1
        self.interval.stored_tokens += tokens

    def store_ended(self, tokens: int, seconds: float) -> None:
        """A store of a request's chunks landed in the CPU tier."""
        self._timed("store", tokens, seconds)

    def _timed(self, what: str, tokens: int, seconds: float) -> None:
        if self.on_flush is None:
            return  # (no one shows them: kept nowhere)
        self._observed.append((f"time_to_{what}", seconds))
        if seconds > 0:
            self._observed.append((f"{what}_speed", tokens / seconds))

    def flush(self, cpu_bytes: int, disk_bytes: int) -> None:
        """The stats logger's turn: the interval becomes part of what the families show."""
        c = self.interval
        self.retrieve_hit_rate = c.hit_tokens / c.requested_tokens if c.requested_tokens else 1.0
        self.lookup_hit_rate = c.lookup_hits / c.lookup_tokens if c.lookup_tokens else 0.0
        self.totals.add(c)
        self.interval = LMCacheCounts()
        if self.on_flush is not None and self._observed:
            self.on_flush(self._observed)
        self._observed = []
        self.local_cache_usage, self.local_storage_usage = cpu_bytes, disk_bytes
