"""One engine's metric values, accumulated from the stats records its steps emit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mocker.config import VLLM_RELEASES, EngineConfig
from mocker.disagg.pulls import PdCounters, PullRecord
from mocker.engine.outputs import StepResult, iteration_stats
from mocker.engine.stats import EngineSnapshot, FinishedRequestStats, IterationStats
from mocker.metrics.histogram import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    NIXL_BYTES_BUCKETS,
    NIXL_DESCRIPTORS_BUCKETS,
    NIXL_XFER_TIME_BUCKETS,
    PARAMS_N_BUCKETS,
    PREEMPTION_BUCKETS,
    PROMOTION_LATENCY_BUCKETS,
    REQUEST_TIME_BUCKETS,
    TRANSFER_SIZE_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
    one_two_five_buckets,
)
from mocker.tiers.transfers import TransferKind, TransferRecord

__all__ = ["FINISH_REASONS", "StatsRecorder"]

FINISH_REASONS = ("stop", "length", "abort", "error")


def _histogram(bounds: tuple[float, ...]) -> Callable[[], Histogram]:
    return lambda: Histogram(bounds)


@dataclass(slots=True)
class StatsRecorder:
    """Counters and histograms of one engine (data-parallel rank), updated on its loop from
    `StepResult`s and `FinishedRequestStats`; gauges come from `snapshot` at scrape time."""

    config: EngineConfig
    engine: str = "0"
    release: str = VLLM_RELEASES[-1]  # the vLLM release whose metric forms are served
    snapshot: Callable[[], EngineSnapshot] | None = None
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_cached_tiers: int = 0  # loaded from the tiers below the device
    prompt_tokens_cached_by_tier: dict[str, int] = field(default_factory=dict)
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_prefix_queries: int = 0
    external_prefix_hits: int = 0
    # Of those, the tokens each tier below the device supplied, counted at admission.
    external_hits_by_tier: dict[str, int] = field(default_factory=dict)
    num_preemptions: int = 0
    offload_store_bytes: int = 0
    offload_load_bytes: int = 0
    offload_store_time: float = 0.0
    offload_load_time: float = 0.0
    # Secondary tiers (vLLM's tiering): bytes and seconds written to / read from each.
    tier_write_bytes: dict[str, int] = field(default_factory=dict)
    tier_write_time: dict[str, float] = field(default_factory=dict)
    tier_read_bytes: dict[str, int] = field(default_factory=dict)
    tier_read_time: dict[str, float] = field(default_factory=dict)
    # vLLM 0.34's promotion latency, by (tier, "success" | "failure"), once observed.
    promotion_latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    ttft: Histogram = field(default_factory=_histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=_histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=_histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=_histogram(REQUEST_TIME_BUCKETS))
    queue: Histogram = field(default_factory=_histogram(REQUEST_TIME_BUCKETS))
    inference: Histogram = field(default_factory=_histogram(REQUEST_TIME_BUCKETS))
    prefill: Histogram = field(default_factory=_histogram(REQUEST_TIME_BUCKETS))
    decode: Histogram = field(default_factory=_histogram(REQUEST_TIME_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=_histogram(ITERATION_TOKEN_BUCKETS))
    request_preemptions: Histogram = field(default_factory=_histogram(PREEMPTION_BUCKETS))
    offload_store_size: Histogram = field(default_factory=_histogram(TRANSFER_SIZE_BUCKETS))
    offload_load_size: Histogram = field(default_factory=_histogram(TRANSFER_SIZE_BUCKETS))
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    request_max_tokens: Histogram = field(init=False)
    # Per request: the most tokens any of its n samples generated (mocker serves n = 1
    # only, so its own count), its n, and the prompt tokens it computed (not cached).
    request_max_generation_tokens: Histogram = field(init=False)
    request_params_n: Histogram = field(default_factory=_histogram(PARAMS_N_BUCKETS))
    request_prefill_kv_computed: Histogram = field(init=False)
    # P/D (vLLM's NIXL metrics): pulls on the decode side; the side channel's counts.
    nixl_xfer_time: Histogram = field(default_factory=_histogram(NIXL_XFER_TIME_BUCKETS))
    nixl_bytes: Histogram = field(default_factory=_histogram(NIXL_BYTES_BUCKETS))
    nixl_descriptors: Histogram = field(default_factory=_histogram(NIXL_DESCRIPTORS_BUCKETS))
    nixl_failed_transfers: int = 0
    pd: PdCounters = field(default_factory=PdCounters)

    def __post_init__(self) -> None:
        token_buckets = one_two_five_buckets(self.config.scheduler.max_model_len)
        self.request_prompt_tokens = Histogram(token_buckets)
        self.request_generation_tokens = Histogram(token_buckets)
        self.request_max_tokens = Histogram(token_buckets)
        self.request_max_generation_tokens = Histogram(token_buckets)
        self.request_prefill_kv_computed = Histogram(token_buckets)

    def current(self) -> EngineSnapshot:
        """The gauges' values now (all zero before the engine is attached)."""
        return self.snapshot() if self.snapshot is not None else EngineSnapshot(0, 0, 0.0)

    # -- feeding ------------------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        """A pass (or an idle result carrying transfers, preemptions or prefix counts)."""
        stats = result.stats
        for record in result.transfers:
            self._transfer(record)
        for pull in result.pulls:
            self._pull(pull)
        # A pass can preempt (or count hits of a load that ended) and still compute nothing.
        self.num_preemptions += stats.num_preemptions
        self.prefix_queries += stats.prefix_queries
        self.prefix_hits += stats.prefix_hits
        self.external_prefix_queries += stats.external_prefix_queries
        self.external_prefix_hits += stats.external_prefix_hits
        if stats.external_hits_by_tier:
            by_tier = self.external_hits_by_tier
            for tier, n in stats.external_hits_by_tier.items():
                by_tier[tier] = by_tier.get(tier, 0) + n
        if result.idle:
            return
        self.iteration_tokens.observe(stats.num_scheduled_tokens)
        self._iteration(iteration_stats(result.outputs))
        for finished in result.finished:
            self.on_finish(finished)

    def _iteration(self, stats: IterationStats) -> None:
        self.generation_tokens += stats.num_generation_tokens
        self.prompt_tokens += stats.num_prompt_tokens
        self.prompt_tokens_cached += stats.num_cached_tokens
        if stats.tier_cached:
            by_tier = self.prompt_tokens_cached_by_tier
            for tier, n in stats.tier_cached.items():
                by_tier[tier] = by_tier.get(tier, 0) + n
                self.prompt_tokens_cached_tiers += n
        self.ttft.observe_each(stats.time_to_first_tokens)
        self.itl.observe_each(stats.inter_token_latencies)

    def _transfer(self, t: TransferRecord) -> None:
        if not t.touches_device:  # CPU ↔ a secondary tier
            tier = t.tier
            if t.kind is TransferKind.LOAD:  # a promotion: its latency, by result
                key = (tier, "success" if t.ok else "failure")
                latency = self.promotion_latency.get(key)
                if latency is None:
                    latency = self.promotion_latency[key] = Histogram(PROMOTION_LATENCY_BUCKETS)
                latency.observe(t.duration)
                if not t.ok:
                    return
            nbytes, time = (
                (self.tier_write_bytes, self.tier_write_time)
                if t.kind is TransferKind.STORE
                else (self.tier_read_bytes, self.tier_read_time)
            )
            nbytes[tier] = nbytes.get(tier, 0) + t.nbytes
            time[tier] = time.get(tier, 0.0) + t.duration
            return
        if t.kind is TransferKind.STORE:
            self.offload_store_bytes += t.nbytes
            self.offload_store_time += t.duration
            self.offload_store_size.observe(t.nbytes)
        else:
            self.offload_load_bytes += t.nbytes
            self.offload_load_time += t.duration
            self.offload_load_size.observe(t.nbytes)

    def _pull(self, p: PullRecord) -> None:
        """A finished pull: timed and sized when its bytes arrived; a failure is counted."""
        if not p.ok:
            self.nixl_failed_transfers += 1
            return
        self.nixl_xfer_time.observe(p.duration)
        self.nixl_bytes.observe(p.nbytes)
        # One descriptor per block and layer, as NIXL describes a READ of a paged cache.
        self.nixl_descriptors.observe(p.num_blocks * self.config.model.num_layers)

    def on_finish(self, r: FinishedRequestStats) -> None:
        """A request ended: in a pass, or outside one (abort, stop string)."""
        reason = r.finish_reason.value
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.e2e.observe(r.e2e_latency)
        self.request_prompt_tokens.observe(r.num_prompt_tokens)
        self.request_generation_tokens.observe(r.num_generation_tokens)
        self.request_max_tokens.observe(r.max_tokens)
        if r.n_param is not None:  # once per request (n > 1: with its last choice)
            self.request_max_generation_tokens.observe(r.max_generation_tokens)
            self.request_params_n.observe(r.n_param)
        self.request_prefill_kv_computed.observe(r.num_prompt_tokens - r.num_cached_tokens)
        if r.num_preemptions:
            self.request_preemptions.observe(r.num_preemptions)
        for histogram, value in (
            (self.queue, r.queued_time),
            (self.inference, r.inference_time),
            (self.prefill, r.prefill_time),
            (self.decode, r.decode_time),
            (self.tpot, r.mean_time_per_output_token),
        ):
            if value is not None:
                histogram.observe(value)
