"""vLLM's metric families: name, help, type, labels and where each value comes from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mocker.metrics.sources import (
    Source,
    by_source,
    cached_by_source,
    cached_by_tier,
    hit_rate,
    per_tier,
    tier_counter,
    waiting_by_reason,
)

__all__ = ["FAMILIES", "KV_FETCH_STAGES", "NIXL_FAMILIES", "Family", "Kind"]


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


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
           G, lambda m, s: waiting_by_reason(s), label="reason", release="0.34"),
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
           by_source, label="source"),
    Family("vllm:prompt_tokens_cached_by_source",
           "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
           "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
           "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
           "vllm:external_prefix_cache_hits.", C, cached_by_source, label="source",
           release="0.34"),
    Family("vllm:prompt_tokens_cached_by_source",
           "Number of cached prompt tokens by the tier they were found in.", C,
           cached_by_tier, label="source", release="0.33"),
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
           per_tier(lambda m: m.tier_write_bytes), label="tier"),
    Family("vllm:kv_offload_tiering_write_time",
           "Total time spent writing from the primary tier to secondary tiers, in seconds, "
           "labeled by tier. Tiers that do not report per-job transfer time have no series here.",
           C, per_tier(lambda m: m.tier_write_time), label="tier"),
    Family("vllm:kv_offload_tiering_read_bytes",
           "Total bytes read from secondary tiers into the primary tier, labeled by tier.", C,
           per_tier(lambda m: m.tier_read_bytes), label="tier"),
    Family("vllm:kv_offload_tiering_read_time",
           "Total time spent reading from secondary tiers into the primary tier, in seconds, "
           "labeled by tier. Tiers that do not report per-job transfer time have no series here. "
           "Use vllm:kv_offload_tiering_promotion_latency_seconds for tier-independent promotion "
           "timing.",
           C, per_tier(lambda m: m.tier_read_time), label="tier"),
    Family("vllm:kv_offload_tiering_chunk_queries",
           "Number of chunk lookup queries sent to a tier, labeled by tier.", C,
           tier_counter("block_queries", primary=True), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_chunk_hits",
           "Number of chunk lookup hits in a tier, labeled by tier.", C,
           tier_counter("block_hits", primary=True), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_active_promotion_jobs",
           "Number of active secondary-tier promotion jobs, labeled by tier.", G,
           tier_counter("active_promotions"), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_active_cascade_jobs",
           "Number of active secondary-tier cascade jobs, labeled by tier.", G,
           tier_counter("active_cascades"), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_primary_write_usage_perc",
           "Current fraction of primary-tier space used by writes from secondary tiers, "
           "labeled by tier.", G, tier_counter("primary_write_usage"), label="tier",
           release="0.34"),
    Family("vllm:kv_offload_tiering_primary_read_usage_perc",
           "Current fraction of primary-tier space used by reads to secondary tiers, labeled "
           "by tier.", G, tier_counter("primary_read_usage"), label="tier", release="0.34"),
    Family("vllm:kv_offload_tiering_block_queries", "Blocks looked up in a secondary tier.", C,
           tier_counter("block_queries"), label="tier", release="0.33"),
    Family("vllm:kv_offload_tiering_block_hits", "Blocks found in a secondary tier.", C,
           tier_counter("block_hits"), label="tier", release="0.33"),
    Family("vllm:kv_offload_tiering_promotion_job_failures",
           "Number of failed secondary-tier promotion jobs, labeled by tier.", C,
           tier_counter("promotion_failures"), label="tier"),
    Family("vllm:kv_offload_tiering_cascade_job_failures",
           "Number of failed secondary-tier cascade jobs, labeled by tier.", C,
           tier_counter("cascade_failures"), label="tier"),
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
    Family("vllm:gpu_prefix_cache_hit_rate", "Prefix cache hit rate (V0 name).", G, hit_rate,
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
