"""The exposition: vLLM's names and labels from the family table, live gauges, legacy aliases."""

from __future__ import annotations

from prometheus_client import generate_latest

from mocker.engine.stats import EngineSnapshot
from mocker.metrics import FAMILIES, MetricsCollector, StatsRecorder, build_registry
from tests.support.engines import make_core


def _render(recorder: StatsRecorder, *, legacy: bool) -> str:
    collector = MetricsCollector([recorder], "m", legacy_names=legacy)
    return generate_latest(build_registry(collector, process=False)).decode()


def test_collector_renders_names_labels_and_live_gauges() -> None:
    core = make_core()
    metrics = StatsRecorder(core.config, engine="0")
    metrics.snapshot = lambda: EngineSnapshot(3, 2, 0.25)
    text = _render(metrics, legacy=True)
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 3.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25' in text
    assert 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25' in text  # legacy alias
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    assert "vllm:prompt_tokens_total{" in text and "_created" not in text
    assert 'vllm:iteration_tokens_total_bucket{engine="0",le="16384.0",model_name="m"}' in text
    assert 'block_size="4"' in text and 'num_gpu_blocks="64"' in text


def test_every_family_in_the_table_is_rendered_once() -> None:
    metrics = StatsRecorder(make_core().config)
    for legacy in (False, True):
        text = _render(metrics, legacy=legacy)
        for family in FAMILIES:
            shown = not family.legacy or legacy
            assert (f"# HELP {family.name}" in text) == shown, family.name
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
