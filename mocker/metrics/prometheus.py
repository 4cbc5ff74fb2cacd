"""The Prometheus exposition: vLLM's names, help, labels and buckets, from the families table.

Values live in plain numbers on each engine's `StatsRecorder` (no locks, no per-observation
objects); the collector renders them at scrape time, and reads the gauges (running, waiting,
KV usage) from the engine's snapshot, so they are always current.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from functools import cache

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mocker.config import EngineConfig
from mocker.config_choices import KVRole
from mocker.engine.stats import EngineSnapshot
from mocker.faults import FaultType
from mocker.metrics.exposition import (
    Series,
    header,
    histogram_text,
    metric_text,
    value_lines,
)
from mocker.metrics.families import FAMILIES, NIXL_FAMILIES, Family, Kind
from mocker.metrics.histogram import Histogram, bound_texts
from mocker.metrics.offload_info import offload_config_info
from mocker.metrics.recorder import StatsRecorder
from mocker.metrics.sources import tier_label

__all__ = ["Exposition", "MetricsCollector", "build_registry"]

_LABELS = ["model_name", "engine"]
_OFFLOAD = "vllm:kv_offload"


def _native_offload(config: EngineConfig) -> bool:
    """A CPU tier vLLM's OffloadingConnector would run (LMCache's has its own metrics)."""
    return config.has_cpu_tier and config.offload.offload_backend == "native"


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
        # vLLM's kv_offload families are its OffloadingConnector's: none without one.
        offload = bool(self.engines) and _native_offload(self.engines[0].config)
        for family in FAMILIES:
            if family.name.startswith(_OFFLOAD) and not offload:
                continue
            if (not family.legacy or self.legacy_names) and family.release in (None, release):
                yield family
        role = self.engines[0].config.transfer.kv_role if self.engines else KVRole.NONE
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
        offload = bool(self.engines) and _native_offload(self.engines[0].config)
        if current and offload and self.engines[0].config.offload.storage_tiers:
            yield self._promotion_latency()
        if current and offload:
            yield offload_config_info([(m.engine, m.config) for m in self.engines],
                                      self.model_name)  # fmt: skip
        if self.engines and self.engines[0].config.lora.enable_lora:
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
        key = (str(self.engines[0].config.lora.max_loras), names, names)
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
            # (LMCache sizes its own tiers: vLLM's config knows none of them.)
            native = _native_offload(cfg)
            cpu_blocks = str(cfg.offload.num_cpu_blocks) if native else "None"
            offload_gib = str(
                cfg.offload.kv_offloading_size
            )  # as given (None with --num-host-blocks)
            tiers = ",".join(
                f"{t.name}={t.capacity_blocks}" for t in cfg.offload.storage_tiers if native
            )
            groups = ",".join(
                f"{g.index}:{g.kind.value}" + (f":{g.sliding_window}" if g.sliding_window else "")
                for g in cfg.layout.groups
            )
            # vLLM's mode: "align" saves Mamba states for prefix caching, "none" does not.
            mamba_mode = "align" if cfg.cache.enable_prefix_caching else "none"
            dep = cfg.timing.deployment
            util = "None" if dep is None else str(dep.gpu_memory_utilization)
            dtype = "auto" if dep is None else dep.kv_cache_dtype
            # vLLM 0.34's: the requests of max_model_len the blocks hold, and their tokens.
            concurrency = cfg.cache.num_gpu_blocks / -(
                -cfg.scheduler.max_model_len // cfg.block_size
            )
            info.add_metric(
                [str(cfg.block_size), util, dtype, str(cfg.cache.enable_prefix_caching), cpu_blocks,
                 str(cfg.cache.num_gpu_blocks), str(int(concurrency * cfg.scheduler.max_model_len)),
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
            index = {t.name: i for i, t in enumerate(m.config.offload.storage_tiers)}
            for (tier, result), h in sorted(m.promotion_latency.items()):
                labels = [self.model_name, m.engine, tier_label(m, index[tier], tier), result]
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
