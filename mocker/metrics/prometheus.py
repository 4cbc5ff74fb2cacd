"""The Prometheus exposition: vLLM's names, help, labels and buckets, from a table of families.

Values live in plain numbers on each engine's `StatsRecorder` (no locks, no per-observation
objects); the collector renders them at scrape time, and reads the gauges (running, waiting,
KV usage) from the engine's snapshot, so they are always current.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mocker.config import KVRole
from mocker.disagg.pulls import PULL_SOURCE
from mocker.engine.stats import EngineSnapshot
from mocker.faults import FaultType
from mocker.metrics.exposition import (
    Series,
    header,
    histogram_text,
    metric_text,
    value_lines,
)
from mocker.metrics.histogram import Histogram, bound_texts
from mocker.metrics.offload_info import offload_config_info
from mocker.metrics.recorder import StatsRecorder

__all__ = [
    "ADMISSION_REASONS",
    "FAMILIES",
    "Exposition",
    "Family",
    "Kind",
    "MetricsCollector",
    "admission_counts",
    "build_registry",
]


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# A family's value for one engine: a number or a histogram, or with `label` set, a
# (label value, number or histogram) pair per series.
Value = float | Histogram | Sequence[tuple[str, float]] | Sequence[tuple[str, Histogram]]
Source = Callable[[StatsRecorder, EngineSnapshot], Value]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family per engine: labelled model_name and engine (and `label` if set)."""

    name: str
    help: str
    kind: Kind
    source: Source
    label: str | None = None
    legacy: bool = False  # a V0-era name, exported only with --legacy-metric-names
    consumer: bool = False  # P/D: exported only by an engine that pulls KV (a kv_consumer)
    release: str | None = None  # exported only when serving this vLLM release (--vllm-compat)


def _by_source(m: StatsRecorder, s: EngineSnapshot) -> Value:
    tiers = m.prompt_tokens_cached_tiers
    return [
        ("local_compute", m.prompt_tokens - m.prompt_tokens_cached),
        ("local_cache_hit", m.prompt_tokens_cached - tiers),
        ("external_kv_transfer", tiers),
    ]


def _tier_names(m: StatsRecorder) -> list[str]:
    """The tiers below the device this engine has: cpu, then the secondary tiers (and p2p:
    the KV a P/D decode engine pulls)."""
    config = m.config
    names = (["cpu"] if config.has_cpu_tier else []) + [t.name for t in config.storage_tiers]
    return names + ([PULL_SOURCE] if config.kv_role.consumes else [])


def _cached_by_tier(m: StatsRecorder, s: EngineSnapshot) -> Value:
    by_tier = m.prompt_tokens_cached_by_tier
    device = [("device", m.prompt_tokens_cached - m.prompt_tokens_cached_tiers)]
    return device + [(tier, by_tier.get(tier, 0)) for tier in _tier_names(m)]


# vLLM 0.34's CacheHitSource, in its order, and the source of each of mocker's tiers (the
# CPU tier is host memory, fs and obj tiers are storage, a P/D pull is another instance's).
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
_SOURCE_OF_TIER = {"cpu": "host", "fs": "disk", "obj": "disk", PULL_SOURCE: "p2p"}


# vLLM 0.34's admission control reasons (vllm:admission_rejections{reason}).
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


def admission_counts() -> dict[str, int]:
    """Rejections by reason, all at zero."""
    return dict.fromkeys(ADMISSION_REASONS, 0)


def _cached_by_source(m: StatsRecorder, s: EngineSnapshot) -> Value:
    """vLLM 0.34's: counted at admission, device hits plus each tier's as its source (the
    sum is prefix_cache_hits + external_prefix_cache_hits), every source listed."""
    counts = dict.fromkeys(CACHE_HIT_SOURCES, 0)
    counts["device"] = m.prefix_hits
    for tier, n in m.external_hits_by_tier.items():
        counts[_SOURCE_OF_TIER.get(tier, "external_unspecified")] += n
    return list(counts.items())


def _waiting_by_reason(s: EngineSnapshot) -> Value:
    deferred = min(s.num_deferred, s.num_waiting)
    return [("capacity", s.num_waiting - deferred), ("deferred", deferred)]


def _tier_label(m: StatsRecorder, index: int, name: str) -> str:
    """A secondary tier's `tier` label: vLLM 0.34's "<position>:<type>" (the CPU tier is
    "0:primary"), 0.33's type."""
    return name if m.release == "0.33" else f"{index + 1}:{name}"


def _per_tier(table: Callable[[StatsRecorder], Mapping[str, float]]) -> Source:
    """A tiering counter from the recorder's table, one series per secondary tier."""

    def source(m: StatsRecorder, s: EngineSnapshot) -> Value:
        values = table(m)
        return [(_tier_label(m, i, t.name), values.get(t.name, 0))
                for i, t in enumerate(m.config.storage_tiers)]  # fmt: skip

    return source


def _tier_counter(attr: str, primary: bool = False) -> Source:
    """A tiering counter from the engine's snapshot, one series per secondary tier (after
    the CPU tier's, "0:primary", with `primary`)."""

    def source(m: StatsRecorder, s: EngineSnapshot) -> Value:
        first = [("0:primary", getattr(s.primary, attr))] if primary and s.primary else []
        return first + [
            (_tier_label(m, i, t.name), getattr(t, attr)) for i, t in enumerate(s.tiers)
        ]

    return source


def _hit_rate(m: StatsRecorder, s: EngineSnapshot) -> float:
    return m.prefix_hits / m.prefix_queries if m.prefix_queries else 0.0


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
# vLLM's transfer_type label values (its deprecated offload families).
LOAD, STORE = "CPU_to_GPU", "GPU_to_CPU"
_REQ = "Histogram of time spent in {} phase for request."

FAMILIES: tuple[Family, ...] = (
    Family("vllm:num_requests_running", "Number of requests in model execution batches.", G,
           lambda m, s: s.num_running),
    Family("vllm:num_requests_waiting", "Number of requests waiting to be processed.", G,
           lambda m, s: s.num_waiting),
    Family("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", G,
           lambda m, s: s.kv_usage),
    Family("vllm:engine_sleep_state",
           "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
           "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
           "level 2.", G, lambda m, s: s.sleep_state, label="sleep_state", release="0.34"),
    Family("vllm:num_requests_waiting_by_reason",
           "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
           "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
           "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
           G, lambda m, s: _waiting_by_reason(s), label="reason", release="0.34"),
    Family("vllm:prefix_cache_queries",
           "Prefix cache queries, in terms of number of queried tokens.", C,
           lambda m, s: m.prefix_queries),
    Family("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
           C, lambda m, s: m.prefix_hits),
    Family("vllm:external_prefix_cache_queries",
           "External prefix cache queries from KV connector cross-instance cache sharing, in "
           "terms of number of queried tokens.", C, lambda m, s: m.external_prefix_queries),
    Family("vllm:external_prefix_cache_hits",
           "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
           "of number of cached tokens.", C, lambda m, s: m.external_prefix_hits),
    Family("vllm:num_preemptions", "Cumulative number of preemption from the engine.", C,
           lambda m, s: m.num_preemptions),
    Family("vllm:prompt_tokens", "Number of prefill tokens processed.", C,
           lambda m, s: m.prompt_tokens),
    Family("vllm:generation_tokens", "Number of generation tokens processed.", C,
           lambda m, s: m.generation_tokens),
    Family("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", C,
           lambda m, s: m.prompt_tokens_cached),
    Family("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", C,
           _by_source, label="source"),
    Family("vllm:prompt_tokens_cached_by_source",
           "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
           "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
           "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
           "vllm:external_prefix_cache_hits.", C, _cached_by_source, label="source",
           release="0.34"),
    Family("vllm:prompt_tokens_cached_by_source",
           "Number of cached prompt tokens by the tier they were found in.", C,
           _cached_by_tier, label="source", release="0.33"),
    Family("vllm:request_success", "Count of successfully processed requests.", C,
           lambda m, s: list(m.finished.items()), label="finished_reason"),
    Family("vllm:kv_offload_store_bytes", "Total bytes stored from GPU to offload storage.", C,
           lambda m, s: m.offload_store_bytes),
    Family("vllm:kv_offload_load_bytes", "Total bytes loaded from offload storage to GPU.", C,
           lambda m, s: m.offload_load_bytes),
    Family("vllm:kv_offload_store_time",
           "Total store time from GPU to offload storage, in seconds.", C,
           lambda m, s: m.offload_store_time),
    Family("vllm:kv_offload_load_time",
           "Total load time from offload storage to GPU, in seconds.", C,
           lambda m, s: m.offload_load_time),
    # vLLM 0.34's CPU tier gauges are the share its transfers pin, 0.33's its residency.
    Family("vllm:kv_offload_cpu_cache_usage_perc",
           "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = idle, "
           "1.0 = saturated). Sustained high values indicate transfers (stores or promotions) "
           "may be dropped due to insufficient capacity.", G,
           lambda m, s: min(s.cpu_read_usage + s.cpu_write_usage, 1.0), release="0.34"),
    Family("vllm:kv_offload_cpu_cache_read_usage_perc",
           "Fraction of CPU KV-cache space currently pinned by in-flight loads that have not "
           "yet completed (0.0 = idle, 1.0 = saturated).", G, lambda m, s: s.cpu_read_usage,
           release="0.34"),
    Family("vllm:kv_offload_cpu_cache_write_usage_perc",
           "Fraction of CPU KV-cache space currently pinned by in-flight stores that have not "
           "yet completed (0.0 = idle, 1.0 = saturated).", G, lambda m, s: s.cpu_write_usage,
           release="0.34"),
    Family("vllm:kv_offload_cpu_cache_usage_perc",
           "CPU tier KV-cache usage. 1 means 100 percent usage.", G,
           lambda m, s: s.cpu_usage, release="0.33"),
    # vLLM 0.34 counts stores a block's reuse threshold held back (mocker's store_threshold,
    # 0 or 1, holds none back) apart from stores that found no room (allocation failures).
    Family("vllm:kv_offload_stores_skipped",
           "Number of KV offload stores skipped because the reuse threshold was not reached.",
           C, lambda m, s: 0, release="0.34"),
    Family("vllm:kv_offload_allocation_failure",
           "Number of KV offload store allocation attempts that failed.", C,
           lambda m, s: s.stores_skipped, release="0.34"),
    Family("vllm:kv_offload_stores_skipped",
           "Blocks not stored to the CPU tier for want of room (every block pinned).", C,
           lambda m, s: s.stores_skipped, release="0.33"),
    Family("vllm:kv_offload_tiering_write_bytes",
           "Total bytes written from the primary tier to secondary tiers, labeled by tier.", C,
           _per_tier(lambda m: m.tier_write_bytes), label="tier"),
    Family("vllm:kv_offload_tiering_write_time",
           "Total time spent writing from the primary tier to secondary tiers, in seconds, "
           "labeled by tier. Tiers that do not report per-job transfer time have no series here.",
           C, _per_tier(lambda m: m.tier_write_time), label="tier"),
    Family("vllm:kv_offload_tiering_read_bytes",
           "Total bytes read from secondary tiers into the primary tier, labeled by tier.", C,
           _per_tier(lambda m: m.tier_read_bytes), label="tier"),
    Family("vllm:kv_offload_tiering_read_time",
           "Total time spent reading from secondary tiers into the primary tier, in seconds, "
           "labeled by tier. Tiers that do not report per-job transfer time have no series here. "
           "Use vllm:kv_offload_tiering_promotion_latency_seconds for tier-independent promotion "
           "timing.",
           C, _per_tier(lambda m: m.tier_read_time), label="tier"),
    Family("vllm:kv_offload_tiering_chunk_queries",
           "Number of chunk lookup queries sent to a tier, labeled by tier.", C,
           _tier_counter("block_queries", primary=True), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_chunk_hits",
           "Number of chunk lookup hits in a tier, labeled by tier.", C,
           _tier_counter("block_hits", primary=True), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_active_promotion_jobs",
           "Number of active secondary-tier promotion jobs, labeled by tier.", G,
           _tier_counter("active_promotions"), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_active_cascade_jobs",
           "Number of active secondary-tier cascade jobs, labeled by tier.", G,
           _tier_counter("active_cascades"), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_primary_write_usage_perc",
           "Current fraction of primary-tier space used by writes from secondary tiers, "
           "labeled by tier.", G, _tier_counter("primary_write_usage"), label="tier",
           release="0.34"),
    Family("vllm:kv_offload_tiering_primary_read_usage_perc",
           "Current fraction of primary-tier space used by reads to secondary tiers, labeled "
           "by tier.", G, _tier_counter("primary_read_usage"), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_block_queries", "Blocks looked up in a secondary tier.", C,
           _tier_counter("block_queries"), label="tier", release="0.33"),
    Family("vllm:kv_offload_tiering_block_hits", "Blocks found in a secondary tier.", C,
           _tier_counter("block_hits"), label="tier", release="0.33"),
    Family("vllm:kv_offload_tiering_promotion_job_failures",
           "Number of failed secondary-tier promotion jobs, labeled by tier.", C,
           _tier_counter("promotion_failures"), label="tier"),
    Family("vllm:kv_offload_tiering_cascade_job_failures",
           "Number of failed secondary-tier cascade jobs, labeled by tier.", C,
           _tier_counter("cascade_failures"), label="tier"),
    Family("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
           H, lambda m, s: m.ttft),
    Family("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
           H, lambda m, s: m.itl),
    Family("vllm:request_time_per_output_token_seconds",
           "Histogram of time_per_output_token_seconds per request.", H, lambda m, s: m.tpot),
    Family("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
           H, lambda m, s: m.e2e),
    Family("vllm:request_queue_time_seconds", _REQ.format("WAITING"), H, lambda m, s: m.queue),
    Family("vllm:request_inference_time_seconds", _REQ.format("RUNNING"), H,
           lambda m, s: m.inference),
    Family("vllm:request_prefill_time_seconds", _REQ.format("PREFILL"), H,
           lambda m, s: m.prefill),
    Family("vllm:request_decode_time_seconds", _REQ.format("DECODE"), H,
           lambda m, s: m.decode),
    Family("vllm:request_prompt_tokens", "Number of prefill tokens processed.", H,
           lambda m, s: m.request_prompt_tokens),
    Family("vllm:request_generation_tokens", "Number of generation tokens processed.", H,
           lambda m, s: m.request_generation_tokens),
    Family("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
           H, lambda m, s: m.request_max_tokens),
    Family("vllm:request_max_num_generation_tokens",
           "Histogram of maximum number of requested generation tokens.", H,
           lambda m, s: m.request_max_generation_tokens),
    Family("vllm:request_params_n", "Histogram of the n request parameter.", H,
           lambda m, s: m.request_params_n),
    Family("vllm:request_prefill_kv_computed_tokens",
           "Histogram of new KV tokens computed during prefill (excluding cached tokens).", H,
           lambda m, s: m.request_prefill_kv_computed),
    Family("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", H,
           lambda m, s: m.iteration_tokens),
    Family("vllm:request_num_preemptions",
           "Histogram of the number of times a request was preempted.", H,
           lambda m, s: m.request_preemptions),
    Family("vllm:kv_offload_store_size", "Histogram of KV offload store operation size, in bytes.",
           H, lambda m, s: m.offload_store_size),
    Family("vllm:kv_offload_load_size", "Histogram of KV offload load operation size, in bytes.",
           H, lambda m, s: m.offload_load_size),
    # The same transfers under the names vLLM deprecated but still exports (and dashboards,
    # llm-d's guides among them, still read): CPU_to_GPU loads, GPU_to_CPU stores.
    Family("vllm:kv_offload_total_bytes", "Number of bytes offloaded by KV connector", C,
           lambda m, s: [(LOAD, m.offload_load_bytes), (STORE, m.offload_store_bytes)],
           label="transfer_type"),
    Family("vllm:kv_offload_total_time", "Total time measured by all KV offloading operations",
           C, lambda m, s: [(LOAD, m.offload_load_time), (STORE, m.offload_store_time)],
           label="transfer_type"),
    Family("vllm:kv_offload_size", "Histogram of KV offload transfer size, in bytes.", H,
           lambda m, s: [(LOAD, m.offload_load_size), (STORE, m.offload_store_size)],
           label="transfer_type"),
    # V0-era names some routers still read.
    Family("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (V0 name).", G,
           lambda m, s: s.kv_usage, legacy=True),
    Family("vllm:cpu_cache_usage_perc", "CPU KV-cache usage (V0 name).", G,
           lambda m, s: s.cpu_usage, legacy=True),
    Family("vllm:num_requests_swapped", "Requests swapped to CPU (V0 name).", G,
           lambda m, s: 0, legacy=True),
    Family("vllm:gpu_prefix_cache_hit_rate", "Prefix cache hit rate (V0 name).", G, _hit_rate,
           legacy=True),
    Family("vllm:gpu_prefix_cache_queries", "Prefix cache queries (old name).", C,
           lambda m, s: m.prefix_queries, legacy=True),
    Family("vllm:gpu_prefix_cache_hits", "Prefix cache hits (old name).", C,
           lambda m, s: m.prefix_hits, legacy=True),
    Family("vllm:time_per_output_token_seconds", "Inter-token latency (V0 name).", H,
           lambda m, s: m.itl, legacy=True),
)  # fmt: skip

KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")

# vLLM's NixlPromMetrics, registered only when a KV connector is configured (P/D), and the
# async-load gauge vLLM registers on a KV consumer.
NIXL_FAMILIES: tuple[Family, ...] = (
    Family("vllm:num_requests_kv_fetch_by_stage", "Number of waiting requests by async KV load "
           "stage. Stage labels: 'waiting_to_start' = needs an async KV load that has not "
           "started; 'in_progress' = load started and not yet reported finished; "
           "'completed_waiting' = load finished, request not running yet.", G,
           lambda m, s: list(zip(KV_FETCH_STAGES, s.kv_fetch, strict=True)), label="stage",
           consumer=True),
    Family("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache "
           "transfers.", H, lambda m, s: m.nixl_xfer_time),
    Family("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache "
           "transfers.", H, lambda m, s: m.nixl_bytes),
    Family("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL  KV Cache "
           "transfers.", H, lambda m, s: m.nixl_descriptors),
    Family("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers, "
           "including handshake and notification failures. NOTE: KV expiry is tracked "
           "separately in vllm:nixl_num_kv_expired_reqs.", C,
           lambda m, s: m.nixl_failed_transfers + m.pd.failed_releases),
    Family("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications. "
           "Retained for compatibility; these failures are also included in "
           "vllm:nixl_num_failed_transfers.", C, lambda m, s: m.pd.failed_notifications),
    Family("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire. "
           "NOTE: This metric is tracked on the P instance.", C, lambda m, s: s.kv_expired),
    Family("vllm:nixl_num_notifications_after_expiry", "Number of completion notifications for "
           "requests that were no longer tracked, usually because their KV lease expired. The "
           "KV blocks may have been reused before the transfer finished. Counted per "
           "notification (one per remote rank), not per request.", C,
           lambda m, s: m.pd.notifications_after_expiry),
)  # fmt: skip

_LABELS = ["model_name", "engine"]


def _sample_name(family: Family) -> str:
    """A family's sample name: a counter's ends in _total, as prometheus_client renders it."""
    if family.kind is Kind.COUNTER:
        return family.name if family.name.endswith("_total") else family.name + "_total"
    return family.name


@cache
def _header(family: Family) -> str:
    return header(_sample_name(family), family.help, family.kind.value)


class MetricsCollector(Collector):
    """Renders the engines' metrics with vLLM's names, labels and buckets."""

    def __init__(
        self,
        engines: Sequence[StatsRecorder],
        model_name: str,
        *,
        legacy_names: bool = False,
        failures: Mapping[FaultType, int] | None = None,
        rejections: Mapping[str, int] | None = None,
    ) -> None:
        self.engines = list(engines)
        # Admission control's rejections by reason (the API server's), read at scrape time.
        self.rejections = rejections
        self.model_name = model_name
        self.legacy_names = legacy_names
        # Injected failures by type (fault injection), read at scrape time.
        self.failures = failures
        # vllm:lora_requests_info: every label set ever current, with the time it last was
        # (vLLM never removes one; readers take the newest).
        self._lora_series: dict[tuple[str, str, str], float] = {}
        # For text(): each engine's labels, escaped once; each histogram's last text, by
        # (sample name, engine), with the counts and sum it shows.
        self._series = [Series(_LABELS, [model_name, m.engine]) for m in self.engines]
        self._extra_series: dict[tuple[str, str, str], Series] = {}
        self._histogram_text: dict[tuple[str, str, str], tuple[tuple[int, ...], float, str]] = {}

    def describe(self) -> list[Metric]:
        return []  # rendered fresh at every scrape; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        rows = self._rows()
        for family in self._families():
            yield self._render(family, rows)
        yield from self._extras(rows)

    def text(self) -> str:
        """What `generate_latest` prints for `collect()`, written straight from the recorders
        (tests/metrics/test_prometheus.py holds the two equal). A scrape runs on the event
        loop of the engine passes, so its time is a gap in every stream: ~8 ms there for
        one engine, well under one here. A histogram whose counts have not moved since the
        last scrape (most of them, most of the time) reuses its text."""
        rows = self._rows()
        out: list[str] = []
        for family in self._families():
            name = _sample_name(family)
            out.append(_header(family))
            for (m, snapshot, _), labels in zip(rows, self._series, strict=True):
                value = family.source(m, snapshot)
                if family.kind is not Kind.HISTOGRAM:
                    value_lines(out, name, labels, value, family.label)
                    continue
                if family.label is None:
                    assert isinstance(value, Histogram), family.name
                    out.append(self._histogram(name, m.engine, labels, value))
                    continue
                for extra, h in value:  # type: ignore[union-attr]
                    assert isinstance(h, Histogram), family.name
                    out.append(self._histogram(
                        name, m.engine, self._labelled(m.engine, family.label, extra), h, extra
                    ))  # fmt: skip
        out.extend(map(metric_text, self._extras(rows)))
        return "".join(out)

    def _histogram(
        self, name: str, engine: str, labels: Series, value: Histogram, extra: str = ""
    ) -> str:
        """A histogram's lines, or its last text while its counts and sum stand still."""
        cache = self._histogram_text
        key, counts = (name, engine, extra), tuple(value.counts)
        hit = cache.get(key)
        if hit is None or hit[0] != counts or hit[1] != value.total:
            text = histogram_text(name, labels, bound_texts(value.bounds), counts, value.total)
            hit = cache[key] = (counts, value.total, text)
        return hit[2]

    def _labelled(self, engine: str, label: str, value: str) -> Series:
        """An engine's series with one more label (a labelled histogram's), made once."""
        key = (engine, label, value)
        series = self._extra_series.get(key)
        if series is None:
            values = [self.model_name, engine, value]
            series = self._extra_series[key] = Series([*_LABELS, label], values)
        return series

    def _rows(self) -> list[tuple[StatsRecorder, EngineSnapshot, list[str]]]:
        return [(m, m.current(), [self.model_name, m.engine]) for m in self.engines]

    def _families(self) -> Iterator[Family]:
        """The table's families this server exports, in order."""
        release = self.engines[0].release if self.engines else None
        for family in FAMILIES:
            if (not family.legacy or self.legacy_names) and family.release in (None, release):
                yield family
        role = self.engines[0].config.kv_role if self.engines else KVRole.NONE
        if role is not KVRole.NONE:
            for family in NIXL_FAMILIES:
                if not family.consumer or role.consumes:
                    yield family

    def _extras(
        self, rows: list[tuple[StatsRecorder, EngineSnapshot, list[str]]]
    ) -> Iterator[Metric]:
        """The families outside the table: cache config, LoRA, injected failures."""
        yield self._cache_config_info()
        current = bool(self.engines) and self.engines[0].release != "0.33"
        if self.rejections is not None and current:
            yield self._admission_rejections(self.rejections)
        if current and self.engines[0].config.storage_tiers:
            yield self._promotion_latency()
        if current and self.engines[0].config.has_cpu_tier:
            yield offload_config_info([(m.engine, m.config) for m in self.engines],
                                      self.model_name)  # fmt: skip
        if self.engines and self.engines[0].config.enable_lora:
            yield self._lora_info([snapshot for _, snapshot, _ in rows])
        if self.failures is not None:
            yield self._injected_failures(self.failures)

    @staticmethod
    def _render(
        family: Family, rows: list[tuple[StatsRecorder, EngineSnapshot, list[str]]]
    ) -> Metric:
        labels = _LABELS if family.label is None else [*_LABELS, family.label]
        if family.kind is Kind.HISTOGRAM:
            histograms = HistogramMetricFamily(family.name, family.help, labels=labels)
            for m, snapshot, label_values in rows:
                h = family.source(m, snapshot)
                if family.label is None:
                    assert isinstance(h, Histogram), family.name
                    histograms.add_metric(label_values, h.cumulative(), h.total)
                    continue
                for extra, one in h:  # type: ignore[union-attr]
                    assert isinstance(one, Histogram), family.name
                    histograms.add_metric([*label_values, extra], one.cumulative(), one.total)
            return histograms
        metric: CounterMetricFamily | GaugeMetricFamily
        if family.kind is Kind.COUNTER:
            metric = CounterMetricFamily(family.name, family.help, labels=labels)
        else:
            metric = GaugeMetricFamily(family.name, family.help, labels=labels)
        for m, snapshot, label_values in rows:
            value = family.source(m, snapshot)
            if isinstance(value, int | float):
                metric.add_metric(label_values, value)
                continue
            assert not isinstance(value, Histogram), family.name
            for extra, v in value:  # one series per value of `family.label`
                assert not isinstance(v, Histogram), family.name
                metric.add_metric([*label_values, extra], v)
        return metric

    def _lora_info(self, snapshots: list[EngineSnapshot]) -> GaugeMetricFamily:
        """vLLM's LoRA gauge: no model_name or engine label; its value the time the label
        set was last current. As vLLM 0.34 builds them, both adapter labels list every
        adapter with a waiting or running request (comma-joined, oldest first)."""
        names = ",".join(dict.fromkeys(a for s in snapshots for a in s.lora_adapters))
        key = (str(self.engines[0].config.max_loras), names, names)
        self._lora_series[key] = time.time()
        info = GaugeMetricFamily(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )  # fmt: skip
        for labels, stamp in self._lora_series.items():
            info.add_metric(list(labels), stamp)
        return info

    def _cache_config_info(self) -> GaugeMetricFamily:
        # vLLM's labels, then the secondary tiers (mocker): "fs=BLOCKS,obj=BLOCKS" or None,
        # and the KV cache groups (mocker): "INDEX:KIND[:WINDOW]" joined by commas.
        names = ["block_size", "gpu_memory_utilization", "cache_dtype", "enable_prefix_caching",
                 "num_cpu_blocks", "num_gpu_blocks", "kv_cache_size_tokens",
                 "kv_cache_max_concurrency", "kv_offloading_size", "mamba_cache_mode",
                 "secondary_tiers", "kv_cache_groups", "engine"]  # fmt: skip
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=names
        )
        for m in self.engines:
            cfg = m.config
            # vLLM renders every value with str(): True/False, None.
            cpu_blocks = str(cfg.num_cpu_blocks) if cfg.has_cpu_tier else "None"
            offload_gib = str(cfg.kv_offloading_size)  # as given (None with --num-host-blocks)
            tiers = ",".join(f"{t.name}={t.capacity_blocks}" for t in cfg.storage_tiers)
            groups = ",".join(
                f"{g.index}:{g.kind.value}" + (f":{g.sliding_window}" if g.sliding_window else "")
                for g in cfg.layout.groups
            )
            # vLLM's mode: "align" saves Mamba states for prefix caching, "none" does not.
            mamba_mode = "align" if cfg.enable_prefix_caching else "none"
            dep = cfg.timing.deployment
            util = "None" if dep is None else str(dep.gpu_memory_utilization)
            dtype = "auto" if dep is None else dep.kv_cache_dtype
            # vLLM 0.34's: the requests of max_model_len the blocks hold, and their tokens.
            concurrency = cfg.num_gpu_blocks / -(-cfg.max_model_len // cfg.block_size)
            info.add_metric(
                [str(cfg.block_size), util, dtype, str(cfg.enable_prefix_caching), cpu_blocks,
                 str(cfg.num_gpu_blocks), str(int(concurrency * cfg.max_model_len)),
                 str(concurrency), offload_gib,
                 mamba_mode if cfg.layout.has_mamba else "none", tiers or "None", groups,
                 m.engine],
                1.0,
            )  # fmt: skip
        return info

    def _promotion_latency(self) -> HistogramMetricFamily:
        """vLLM 0.34's per-promotion latency by tier and result (a series once observed)."""
        family = HistogramMetricFamily(
            "vllm:kv_offload_tiering_promotion_latency_seconds",
            "Histogram of per-job latency for secondary-tier promotion attempts, measured from "
            "job creation until the tiering manager observes completion so that tier queueing "
            "is included, labeled by tier and result, in seconds. Includes failed attempts.",
            labels=[*_LABELS, "tier", "result"],
        )
        for m in self.engines:
            index = {t.name: i for i, t in enumerate(m.config.storage_tiers)}
            for (tier, result), h in sorted(m.promotion_latency.items()):
                labels = [self.model_name, m.engine, _tier_label(m, index[tier], tier), result]
                family.add_metric(labels, h.cumulative(), h.total)
        return family

    def _admission_rejections(self, rejections: Mapping[str, int]) -> CounterMetricFamily:
        # The API server's counter: the model, no engine label (vLLM's).
        rejected = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason, n in rejections.items():
            rejected.add_metric([self.model_name, reason], n)
        return rejected

    def _injected_failures(self, failures: Mapping[FaultType, int]) -> CounterMetricFamily:
        injected = CounterMetricFamily(
            "mocker:injected_failures",
            "Requests failed on purpose (fault injection), by failure type.",
            labels=["model_name", "type"],
        )
        for kind, n in failures.items():
            injected.add_metric([self.model_name, str(kind)], n)
        return injected


def build_registry(collector: MetricsCollector, *, process: bool = True) -> CollectorRegistry:
    """A registry with the vLLM collector (and process/GC metrics, as vLLM's server has)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if process:
        for extra in process_collectors():
            registry.register(extra)
    return registry


def process_collectors() -> tuple[Collector, ...]:
    """prometheus_client's process, GC and platform collectors (vLLM's server exports them)."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

    return (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR)


class Exposition:
    """The /metrics body: the collector's text, then the process collectors' (the order one
    registry of all of them renders in, as `build_registry` builds it)."""

    def __init__(self, collector: MetricsCollector, *, process: bool = True) -> None:
        self.collector = collector
        self._process = process_collectors() if process else ()

    def render(self) -> bytes:
        process = "".join([metric_text(m) for c in self._process for m in c.collect()])
        return (self.collector.text() + process).encode()
