"""Where each metric family's values come from: an engine's recorder and its snapshot."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from mocker.disagg.pulls import PULL_SOURCE
from mocker.engine.stats import EngineSnapshot
from mocker.metrics.histogram import Histogram
from mocker.metrics.recorder import StatsRecorder

__all__ = [
    "ADMISSION_REASONS",
    "CACHE_HIT_SOURCES",
    "Source",
    "Value",
    "admission_counts",
    "by_source",
    "cached_by_source",
    "cached_by_tier",
    "hit_rate",
    "per_tier",
    "tier_counter",
    "tier_label",
    "waiting_by_reason",
]

# A family's value for one engine: a number or a histogram, or with `label` set, a
# (label value, number or histogram) pair per series.
Value = float | Histogram | Sequence[tuple[str, float]] | Sequence[tuple[str, Histogram]]
Source = Callable[[StatsRecorder, EngineSnapshot], Value]


def by_source(m: StatsRecorder, s: EngineSnapshot) -> Value:
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
    names = (["cpu"] if config.has_cpu_tier else []) + [
        t.name for t in config.offload.storage_tiers
    ]
    return names + ([PULL_SOURCE] if config.transfer.kv_role.consumes else [])


def cached_by_tier(m: StatsRecorder, s: EngineSnapshot) -> Value:
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


def cached_by_source(m: StatsRecorder, s: EngineSnapshot) -> Value:
    """vLLM 0.34's: counted at admission, device hits plus each tier's as its source (the
    sum is prefix_cache_hits + external_prefix_cache_hits), every source listed."""
    counts = dict.fromkeys(CACHE_HIT_SOURCES, 0)
    counts["device"] = m.prefix_hits
    # (LMCacheConnectorV1 names no source for its hits: vLLM counts them unspecified.)
    lmcache = m.config.offload.offload_backend == "lmcache"
    for tier, n in m.external_hits_by_tier.items():
        source = "external_unspecified" if lmcache else _SOURCE_OF_TIER.get(tier)
        counts[source or "external_unspecified"] += n
    return list(counts.items())


def waiting_by_reason(s: EngineSnapshot) -> Value:
    deferred = min(s.num_deferred, s.num_waiting)
    return [("capacity", s.num_waiting - deferred), ("deferred", deferred)]


def tier_label(m: StatsRecorder, index: int, name: str) -> str:
    """A secondary tier's `tier` label: vLLM 0.34's "<position>:<type>" (the CPU tier is
    "0:primary"), 0.33's type."""
    return name if m.release == "0.33" else f"{index + 1}:{name}"


def per_tier(table: Callable[[StatsRecorder], Mapping[str, float]]) -> Source:
    """A tiering counter from the recorder's table, one series per secondary tier."""

    def source(m: StatsRecorder, s: EngineSnapshot) -> Value:
        values = table(m)
        return [(tier_label(m, i, t.name), values.get(t.name, 0))
                for i, t in enumerate(m.config.offload.storage_tiers)]  # fmt: skip

    return source


def tier_counter(attr: str, primary: bool = False) -> Source:
    """A tiering counter from the engine's snapshot, one series per secondary tier (after
    the CPU tier's, "0:primary", with `primary`)."""

    def source(m: StatsRecorder, s: EngineSnapshot) -> Value:
        first = [("0:primary", getattr(s.primary, attr))] if primary and s.primary else []
        return first + [(tier_label(m, i, t.name), getattr(t, attr)) for i, t in enumerate(s.tiers)]

    return source


def hit_rate(m: StatsRecorder, s: EngineSnapshot) -> float:
    return m.prefix_hits / m.prefix_queries if m.prefix_queries else 0.0
