"""vLLM's Prometheus metrics, fed by engine step results and finished requests.

Values live in plain Python numbers updated on the engine loop (no locks, no
per-observation objects); a custom collector renders them at scrape time, and
reads the gauges (running, waiting, KV usage) from the engine's live state, so
they are always current — KV usage is 0 whenever the engine is idle.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from mocker.config import EngineConfig
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.request import FinishReason, Request
from mocker.tiers.offload import TransferKind

__all__ = [
    "BUCKETS",
    "EngineMetrics",
    "EngineSnapshot",
    "Histogram",
    "MetricsCollector",
    "build_registry",
    "one_two_five_buckets",
]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
TRANSFER_SIZE_BUCKETS = (1e6, 5e6, 1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 1.5e8, 2e8)

BUCKETS = {
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "request_time": REQUEST_TIME_BUCKETS,
    "iteration_tokens": ITERATION_TOKEN_BUCKETS,
    "preemptions": PREEMPTION_BUCKETS,
    "transfer_size": TRANSFER_SIZE_BUCKETS,
}

FINISH_REASONS = ("stop", "length", "abort", "error")


def one_two_five_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, … up to `limit` (vLLM's token-count buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(value)
        exponent += 1


class Histogram:
    """Bucket counts; `observe(v, n)` records n equal observations at once."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n  # le: value <= bound
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((floatToGoString(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """Gauges read at scrape time."""

    num_running: int
    num_waiting: int
    kv_usage: float
    host_usage: float = 0.0  # host tier: used / capacity


@dataclass(slots=True)
class EngineMetrics:
    """Counters and histograms of one engine (data-parallel rank), updated on its loop."""

    config: EngineConfig
    engine: str = "0"
    snapshot: Callable[[], EngineSnapshot] | None = None
    lookup: Callable[[str], Request | None] | None = None  # live requests, for TTFT
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_cached_host: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_prefix_queries: int = 0
    external_prefix_hits: int = 0
    num_preemptions: int = 0
    offload_store_bytes: int = 0
    offload_load_bytes: int = 0
    offload_store_time: float = 0.0
    offload_load_time: float = 0.0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    _last_token_time: dict[str, float] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_TIME_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_TIME_BUCKETS))
    inference: Histogram = field(default_factory=lambda: Histogram(REQUEST_TIME_BUCKETS))
    prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_TIME_BUCKETS))
    decode: Histogram = field(default_factory=lambda: Histogram(REQUEST_TIME_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKEN_BUCKETS))
    request_preemptions: Histogram = field(default_factory=lambda: Histogram(PREEMPTION_BUCKETS))
    offload_store_size: Histogram = field(default_factory=lambda: Histogram(TRANSFER_SIZE_BUCKETS))
    offload_load_size: Histogram = field(default_factory=lambda: Histogram(TRANSFER_SIZE_BUCKETS))
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    request_max_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        token_buckets = one_two_five_buckets(self.config.max_model_len)
        self.request_prompt_tokens = Histogram(token_buckets)
        self.request_generation_tokens = Histogram(token_buckets)
        self.request_max_tokens = Histogram(token_buckets)

    # -- feeding ------------------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        stats = result.stats
        if result.transfers:
            self._transfers(result)
        # A pass can preempt (or count hits of a load that ended) and still compute nothing.
        self.num_preemptions += stats.num_preemptions
        self.prefix_queries += stats.prefix_queries
        self.prefix_hits += stats.prefix_hits
        self.external_prefix_queries += stats.external_prefix_queries
        self.external_prefix_hits += stats.external_prefix_hits
        if result.idle:
            return
        self.iteration_tokens.observe(stats.num_scheduled_tokens)
        last = self._last_token_time
        itl = self.itl
        generated = 0
        for out in result.outputs:
            n = len(out.new_token_ids)
            if not n:
                continue
            generated += n
            rid = out.request_id
            prev = last.get(rid)
            if prev is None:
                self._first_token(out, result)
            else:
                itl.observe(out.time - prev)
            if out.finished:
                last.pop(rid, None)
            else:
                last[rid] = out.time
        self.generation_tokens += generated
        for request in result.finished:
            # Its final output may have been dropped (the client left during the pass).
            last.pop(request.request_id, None)
            self._finished(request)

    def _transfers(self, result: StepResult) -> None:
        for t in result.transfers:
            if t.kind is TransferKind.STORE:
                self.offload_store_bytes += t.nbytes
                self.offload_store_time += t.duration
                self.offload_store_size.observe(t.nbytes)
            else:
                self.offload_load_bytes += t.nbytes
                self.offload_load_time += t.duration
                self.offload_load_size.observe(t.nbytes)

    def on_finish(self, request: Request) -> None:
        """A request that ended outside a pass (abort, stop string)."""
        self._last_token_time.pop(request.request_id, None)
        self._finished(request)

    def _first_token(self, out: RequestOutput, result: StepResult) -> None:
        cached = out.num_cached_tokens
        self.prompt_tokens += out.num_prompt_tokens
        self.prompt_tokens_cached += cached
        self.prompt_tokens_cached_host += out.num_host_cached_tokens
        request = self.lookup(out.request_id) if self.lookup is not None else None
        if request is None:  # finished in this very pass
            request = next((r for r in result.finished if r.request_id == out.request_id), None)
        if request is not None:
            self.ttft.observe(out.time - request.arrival_time)

    def _finished(self, r: Request) -> None:
        reason = r.finish_reason or FinishReason.ABORT
        self.finished[reason.value] = self.finished.get(reason.value, 0) + 1
        end = r.finished_time if r.finished_time is not None else r.arrival_time
        self.e2e.observe(end - r.arrival_time)
        n_out = r.num_output_tokens
        self.request_prompt_tokens.observe(r.num_prompt_tokens)
        self.request_generation_tokens.observe(n_out)
        self.request_max_tokens.observe(r.max_tokens)
        if r.num_preemptions:
            self.request_preemptions.observe(r.num_preemptions)
        if r.first_scheduled_time is None:
            return
        self.queue.observe(r.first_scheduled_time - r.arrival_time)
        self.inference.observe(end - r.first_scheduled_time)
        if r.first_token_time is None:
            return
        self.prefill.observe(r.first_token_time - r.first_scheduled_time)
        decode = end - r.first_token_time
        self.decode.observe(decode)
        if n_out > 1:
            self.tpot.observe(decode / (n_out - 1))


_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("vllm:time_to_first_token_seconds", "ttft", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "itl", "Histogram of inter-token latency in seconds."),
    (
        "vllm:request_time_per_output_token_seconds",
        "tpot",
        "Histogram of time_per_output_token_seconds per request.",
    ),
    ("vllm:e2e_request_latency_seconds", "e2e", "Histogram of e2e request latency in seconds."),
    (
        "vllm:request_queue_time_seconds",
        "queue",
        "Histogram of time spent in WAITING phase for request.",
    ),
    (
        "vllm:request_inference_time_seconds",
        "inference",
        "Histogram of time spent in RUNNING phase for request.",
    ),
    (
        "vllm:request_prefill_time_seconds",
        "prefill",
        "Histogram of time spent in PREFILL phase for request.",
    ),
    (
        "vllm:request_decode_time_seconds",
        "decode",
        "Histogram of time spent in DECODE phase for request.",
    ),
    (
        "vllm:request_prompt_tokens",
        "request_prompt_tokens",
        "Number of prefill tokens processed.",
    ),
    (
        "vllm:request_generation_tokens",
        "request_generation_tokens",
        "Number of generation tokens processed.",
    ),
    (
        "vllm:request_params_max_tokens",
        "request_max_tokens",
        "Histogram of the max_tokens request parameter.",
    ),
    (
        "vllm:iteration_tokens_total",
        "iteration_tokens",
        "Histogram of number of tokens per engine_step.",
    ),
    (
        "vllm:request_num_preemptions",
        "request_preemptions",
        "Number of preemptions of each preempted request.",
    ),
    (
        "vllm:kv_offload_store_size",
        "offload_store_size",
        "Bytes per KV offload store (device to host transfer).",
    ),
    (
        "vllm:kv_offload_load_size",
        "offload_load_size",
        "Bytes per KV offload load (host to device transfer).",
    ),
)


class MetricsCollector(Collector):
    """Renders the engines' metrics with vLLM's names, labels and buckets."""

    def __init__(
        self,
        engines: Sequence[EngineMetrics],
        model_name: str,
        *,
        legacy_names: bool = False,
        failures: Mapping[str, int] | None = None,
    ) -> None:
        self.engines = list(engines)
        self.model_name = model_name
        self.legacy_names = legacy_names
        # Injected failures by type (fault injection), read at scrape time.
        self.failures = failures

    def describe(self) -> list[Metric]:
        return []  # rendered fresh at every scrape; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "engine"]
        engines = [(m, [self.model_name, m.engine]) for m in self.engines]
        snaps = [(m.snapshot() if m.snapshot else EngineSnapshot(0, 0, 0.0)) for m in self.engines]

        def gauge(name: str, doc: str, values: Sequence[float]) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            for (_, lv), v in zip(engines, values, strict=True):
                g.add_metric(lv, v)
            return g

        def counter(name: str, doc: str, attr: str) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            for m, lv in engines:
                c.add_metric(lv, getattr(m, attr))
            return c

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            [s.num_running for s in snaps],
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            [s.num_waiting for s in snaps],
        )
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            [s.kv_usage for s in snaps],
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            "prefix_queries",
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            "prefix_hits",
        )
        yield counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
            "external_prefix_queries",
        )
        yield counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
            "of number of cached tokens.",
            "external_prefix_hits",
        )
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            "num_preemptions",
        )  # fmt: skip
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens")
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"
        )
        yield counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            "prompt_tokens_cached",
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*labels, "source"],
        )
        cached_by_source = CounterMetricFamily(
            "vllm:prompt_tokens_cached_by_source",
            "Number of cached prompt tokens by the tier they were found in.",
            labels=[*labels, "source"],
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
        )
        for m, lv in engines:
            host_hit = m.prompt_tokens_cached_host
            local_hit = m.prompt_tokens_cached - host_hit
            by_source.add_metric([*lv, "local_compute"], m.prompt_tokens - m.prompt_tokens_cached)
            by_source.add_metric([*lv, "local_cache_hit"], local_hit)
            by_source.add_metric([*lv, "external_kv_transfer"], host_hit)
            cached_by_source.add_metric([*lv, "device"], local_hit)
            cached_by_source.add_metric([*lv, "host"], host_hit)
            for reason, n in m.finished.items():
                success.add_metric([*lv, reason], n)
        yield by_source
        yield cached_by_source
        yield success
        for name, attr, doc in (
            ("vllm:kv_offload_store_bytes", "offload_store_bytes", "Bytes stored to the CPU tier."),
            ("vllm:kv_offload_load_bytes", "offload_load_bytes", "Bytes loaded from the CPU tier."),
            (
                "vllm:kv_offload_store_time",
                "offload_store_time",
                "Seconds spent in KV offload stores.",
            ),
            (
                "vllm:kv_offload_load_time",
                "offload_load_time",
                "Seconds spent in KV offload loads.",
            ),
        ):
            yield counter(name, doc, attr)
        yield gauge(
            "vllm:kv_offload_cpu_cache_usage_perc",
            "CPU (host tier) KV-cache usage. 1 means 100 percent usage.",
            [s.host_usage for s in snaps],
        )
        for name, attr, doc in _HISTOGRAMS:
            h = HistogramMetricFamily(name, doc, labels=labels)
            for m, lv in engines:
                hist: Histogram = getattr(m, attr)
                h.add_metric(lv, hist.cumulative(), hist.total)
            yield h
        yield self._cache_config_info()
        if self.failures is not None:
            injected = CounterMetricFamily(
                "mocker:injected_failures",
                "Requests failed on purpose (fault injection), by failure type.",
                labels=["model_name", "type"],
            )
            for kind, n in self.failures.items():
                injected.add_metric([self.model_name, str(kind)], n)
            yield injected
        if self.legacy_names:
            yield from self._legacy(engines, snaps, labels)

    def _cache_config_info(self) -> GaugeMetricFamily:
        names = ["block_size", "cache_dtype", "enable_prefix_caching", "num_cpu_blocks",
                 "num_gpu_blocks", "kv_offloading_size", "engine"]  # fmt: skip
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=names
        )
        for m in self.engines:
            cfg = m.config
            # vLLM renders every value with str(): True/False, None.
            cpu_blocks = str(cfg.num_host_blocks) if cfg.has_host_tier else "None"
            offload_gib = str(cfg.kv_offloading_size)  # as given (None with --num-host-blocks)
            info.add_metric(
                [str(cfg.block_size), "auto", str(cfg.enable_prefix_caching), cpu_blocks,
                 str(cfg.num_gpu_blocks), offload_gib, m.engine],
                1.0,
            )  # fmt: skip
        return info

    def _legacy(
        self,
        engines: list[tuple[EngineMetrics, list[str]]],
        snaps: list[EngineSnapshot],
        labels: list[str],
    ) -> Iterator[Metric]:
        usage = GaugeMetricFamily(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage (V0 name).", labels=labels
        )
        cpu = GaugeMetricFamily(
            "vllm:cpu_cache_usage_perc", "CPU KV-cache usage (V0 name).", labels=labels
        )
        swapped = GaugeMetricFamily(
            "vllm:num_requests_swapped", "Requests swapped to CPU (V0 name).", labels=labels
        )
        hit_rate = GaugeMetricFamily(
            "vllm:gpu_prefix_cache_hit_rate", "Prefix cache hit rate (V0 name).", labels=labels
        )
        queries = CounterMetricFamily(
            "vllm:gpu_prefix_cache_queries", "Prefix cache queries (old name).", labels=labels
        )
        hits = CounterMetricFamily(
            "vllm:gpu_prefix_cache_hits", "Prefix cache hits (old name).", labels=labels
        )
        tpot = HistogramMetricFamily(
            "vllm:time_per_output_token_seconds",
            "Inter-token latency (V0 name).",
            labels=labels,
        )
        for (m, lv), s in zip(engines, snaps, strict=True):
            usage.add_metric(lv, s.kv_usage)
            cpu.add_metric(lv, s.host_usage)
            swapped.add_metric(lv, 0)
            hit_rate.add_metric(lv, m.prefix_hits / m.prefix_queries if m.prefix_queries else 0.0)
            queries.add_metric(lv, m.prefix_queries)
            hits.add_metric(lv, m.prefix_hits)
            tpot.add_metric(lv, m.itl.cumulative(), m.itl.total)
        yield from (usage, cpu, swapped, hit_rate, queries, hits, tpot)


def build_registry(collector: MetricsCollector, *, process: bool = True) -> CollectorRegistry:
    """A registry with the vLLM collector (and process/GC metrics, as vLLM's server has)."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if process:
        for extra in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
            registry.register(extra)
    return registry
