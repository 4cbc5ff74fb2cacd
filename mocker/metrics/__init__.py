"""vLLM's Prometheus metrics: engine recorders fed by stats records, a table-driven collector."""

from __future__ import annotations

from mocker.metrics.families import FAMILIES, Family
from mocker.metrics.histogram import BUCKETS, Histogram, one_two_five_buckets
from mocker.metrics.prometheus import Exposition, MetricsCollector, build_registry
from mocker.metrics.recorder import StatsRecorder

__all__ = [
    "BUCKETS",
    "FAMILIES",
    "Exposition",
    "Family",
    "Histogram",
    "MetricsCollector",
    "StatsRecorder",
    "build_registry",
    "one_two_five_buckets",
]
