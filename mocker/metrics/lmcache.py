"""LMCache's own Prometheus families (lmcache/observability.py, LMCache 0.5), as one process of
it shows them on its internal API server: a worker's with what it counted, the scheduler's
with none of it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mocker.metrics.histogram import Histogram
from mocker.tiers.lmcache_stats import LMCacheStats

__all__ = ["LABELS", "LMCacheCollector"]

LABELS = ("model_name", "worker_id", "role", "served_model_name")
# (counter, the LMCacheCounts field, help) in LMCache's order.
_COUNTERS = (
    ("num_retrieve_requests", "retrieve_requests",
     "Total number of retrieve requests sent to lmcache"),
    ("num_store_requests", "store_requests", "Total number of store requests sent to lmcache"),
    ("num_lookup_requests", "lookup_requests",
     "Total number of lookup requests sent to lmcache"),
    ("num_requested_tokens", "requested_tokens",
     "Total number of tokens requested from lmcache"),
    ("num_hit_tokens", "hit_tokens", "Total number of tokens hit in lmcache"),
    ("num_stored_tokens", "stored_tokens",
     "Total number of tokens stored in lmcache including evicted ones"),
    ("num_lookup_tokens", "lookup_tokens",
     "Total number of tokens requested in lookup from lmcache"),
    ("num_lookup_hits", "lookup_hits", "Total number of tokens hit in lookup from lmcache"),
    ("num_vllm_hit_tokens", "vllm_hit_tokens", "Number of hit tokens in vllm"),
    ("num_prompt_tokens", "prompt_tokens", "Number of prompt tokens in lmcache"),
)  # fmt: skip
_GAUGES = (
    ("retrieve_hit_rate", "Hit rate of lmcache retrieve requests since last log"),
    ("lookup_hit_rate", "Hit rate of lmcache lookup requests since last log"),
    ("local_cache_usage", "Local cache usage (bytes) of lmcache"),
    ("remote_cache_usage", "Remote cache usage (bytes) of lmcache"),
    ("local_storage_usage", "Local storage usage (bytes) of lmcache"),
)
_TIME = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0)  # fmt: skip
_SPEED = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_HISTOGRAMS = (
    ("time_to_retrieve", "Time to retrieve from lmcache (seconds)", _TIME),
    ("time_to_store", "Time to store to lmcache (seconds)", _TIME),
    ("time_to_lookup", "Time to lookup in lmcache (seconds)",
     tuple(0.00001 * 2**i for i in range(20))),
    ("retrieve_speed", "Retrieve speed of lmcache (tokens per second)", _SPEED),
    ("store_speed", "Store speed of lmcache (tokens per second)", _SPEED),
    ("request_cache_hit_rate", "Request cache hit rate",
     (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)),
)  # fmt: skip
_HEALTHY = ("lmcache_is_healthy", "The health status of LMCache (1=healthy, 0=unhealthy)")


class LMCacheCollector(Collector):
    """One LMCache process's families: a worker's (`stats`: what it counted, flushed every
    10 s; a histogram has samples once observed), or the scheduler's (`stats` None: the
    families without samples, and its health gauge at 0, as LMCache's scheduler leaves it)."""

    def __init__(self, stats: LMCacheStats | None, label_values: tuple[str, ...]) -> None:
        self._stats = stats
        self._values = list(label_values)
        self._histograms = {name: Histogram(bounds) for name, _, bounds in _HISTOGRAMS}
        if stats is not None:
            stats.on_flush = self._observe

    def _observe(self, observations: list[tuple[str, float]]) -> None:
        for name, value in observations:
            self._histograms[name].observe(value)

    def collect(self) -> Iterator[Metric]:
        stats, values = self._stats, self._values
        for name, field, help_text in _COUNTERS:
            counter = CounterMetricFamily("lmcache:" + name, help_text, labels=LABELS)
            if stats is not None:
                counter.add_metric(values, getattr(stats.totals, field))
            yield counter
        for name, help_text in _GAUGES:
            gauge = GaugeMetricFamily("lmcache:" + name, help_text, labels=LABELS)
            if stats is not None:
                gauge.add_metric(values, getattr(stats, name, 0))
            yield gauge
        for name, help_text, _ in _HISTOGRAMS:
            family = HistogramMetricFamily("lmcache:" + name, help_text, labels=LABELS)
            h = self._histograms[name]
            if h.count:
                family.add_metric(values, h.cumulative(), h.total)
            yield family
        healthy = GaugeMetricFamily("lmcache:" + _HEALTHY[0], _HEALTHY[1], labels=LABELS)
        healthy.add_metric(values, 1.0 if stats is not None else 0.0)
        yield healthy
