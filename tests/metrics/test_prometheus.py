"""The exposition: vLLM's names and labels from the family table, live gauges, legacy aliases."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from mocker.config import VLLM_RELEASES
from mocker.config_choices import KVRole
from mocker.engine.stats import EngineSnapshot, TierSnapshot
from mocker.engine.virtual import VirtualDriver
from mocker.faults import FaultType
from mocker.metrics import (
    FAMILIES,
    Exposition,
    MetricsCollector,
    StatsRecorder,
    build_registry,
)
from mocker.metrics.sources import admission_counts
from mocker.storage_spec import StorageKind, StorageTierSpec
from tests.support.engines import make_core, req


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


@pytest.mark.parametrize("release", VLLM_RELEASES)
def test_every_family_in_the_table_is_rendered_once(release: str) -> None:
    # (With a CPU tier: vLLM's kv_offload families are its OffloadingConnector's.)
    metrics = StatsRecorder(make_core(num_cpu_blocks=8).config, release=release)
    for legacy in (False, True):
        text = _render(metrics, legacy=legacy)
        for family in FAMILIES:
            shown = (not family.legacy or legacy) and family.release in (None, release)
            heads = [f"# HELP {family.name}{suffix} " for suffix in ("", "_total")]
            helped = any(f"{head}{family.help}\n" in text for head in heads)
            assert helped == shown, family.name
            count = sum(text.count(head) for head in heads)
            assert count == (shown or family.name in SHARED), family.name
    names = [(f.name, f.release) for f in FAMILIES]
    assert len(names) == len(set(names))


# Families whose 0.33 and 0.34 forms share a name (and differ in labels and help).
SHARED = {"vllm:prompt_tokens_cached_by_source", "vllm:kv_offload_cpu_cache_usage_perc",
          "vllm:kv_offload_stores_skipped"}  # fmt: skip


def _fed_recorders(**overrides: object) -> list[StatsRecorder]:
    """Two ranks' recorders after a small virtual run each (histograms with counts)."""
    recorders = []
    for rank in range(2):
        core = make_core(**overrides)
        metrics = StatsRecorder(core.config, engine=str(rank))
        requests = [req(f"r{i}", [7, i, i + 1, 9, 9], max_tokens=3 + i + rank) for i in range(5)]
        for result in VirtualDriver(core).steps(requests):
            metrics.on_step(result)
        metrics.snapshot = lambda rank=rank: EngineSnapshot(rank, 1, 0.125 * (rank + 1))
        recorders.append(metrics)
    return recorders


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_cpu_blocks": 64, "storage_tiers": (StorageTierSpec(StorageKind.FS, 128, 4.0, 2.0),)},
        {"kv_role": KVRole.CONSUMER},
        {"kv_role": KVRole.PRODUCER, "enable_lora": True},
    ],
    ids=["plain", "tiers", "consumer", "producer-lora"],
)
def test_text_is_what_generate_latest_prints(
    overrides: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """text() (what /metrics serves) against the Metric objects of collect() rendered by
    prometheus_client, with two ranks, legacy names, injected failures and a model name
    that needs escaping; again after more observations (the histogram text cache)."""
    # A fixed time for the LoRA gauge, whose value is the wall time of its last change.
    monkeypatch.setattr("mocker.metrics.prometheus.time.time", lambda: 1_700_000_000.5)
    recorders = _fed_recorders(**overrides)
    collector = MetricsCollector(
        recorders, 'model "x"\\y', legacy_names=True, failures={FaultType.RATE_LIMIT: 2}
    )

    def reference() -> str:
        return generate_latest(build_registry(collector, process=False)).decode()

    first = collector.text()
    assert first == reference()
    assert 'le="+Inf",model_name="model \\"x\\"\\\\y"' in first
    recorders[1].ttft.observe(0.003)  # one histogram moves
    recorders[0].offload_load_size.observe(3e6)  # and one behind a label (transfer_type)
    recorders[0].prompt_tokens += 5
    second = collector.text()
    assert second == reference() and second != first
    ttft = 'vllm:time_to_first_token_seconds_count{engine="1",model_name="model \\"x\\"\\\\y"}'
    assert f"{ttft} {recorders[1].ttft.count}.0\n" in second


def test_the_deprecated_offload_families_mirror_the_flat_ones() -> None:
    """vLLM still exports its transfer_type families beside the flat ones, from the same
    transfers: CPU_to_GPU the loads, GPU_to_CPU the stores (both series from the start)."""
    (metrics,) = _fed_recorders(num_cpu_blocks=8)[:1]
    text = MetricsCollector([metrics], "m").text()
    labels = 'engine="0",model_name="m",transfer_type="{}"'
    for kind in ("CPU_to_GPU", "GPU_to_CPU"):
        assert f"vllm:kv_offload_total_bytes_total{{{labels.format(kind)}}} 0.0\n" in text
        assert f"vllm:kv_offload_size_count{{{labels.format(kind)}}} 0.0\n" in text
    metrics.offload_load_bytes, metrics.offload_load_time = 6_000_000, 0.25
    metrics.offload_store_bytes, metrics.offload_store_time = 2_000_000, 0.5
    metrics.offload_load_size.observe(6e6)
    for size in (1e6, 1e6):
        metrics.offload_store_size.observe(size)
    text = MetricsCollector([metrics], "m").text()
    load, store = labels.format("CPU_to_GPU"), labels.format("GPU_to_CPU")
    for line in (
        f"vllm:kv_offload_total_bytes_total{{{load}}} 6e+06",
        f"vllm:kv_offload_total_bytes_total{{{store}}} 2e+06",
        f"vllm:kv_offload_total_time_total{{{load}}} 0.25",
        f"vllm:kv_offload_total_time_total{{{store}}} 0.5",
        f"vllm:kv_offload_size_count{{{load}}} 1.0",
        f"vllm:kv_offload_size_sum{{{store}}} 2e+06",
        'vllm:kv_offload_size_bucket{engine="0",le="1e+06",model_name="m",'
        'transfer_type="GPU_to_CPU"} 2.0',
        'vllm:kv_offload_load_bytes_total{engine="0",model_name="m"} 6e+06',
    ):
        assert line + "\n" in text, line


def test_the_scrape_body_is_the_collector_then_the_process_metrics() -> None:
    collector = MetricsCollector(_fed_recorders(), "m")
    body = Exposition(collector).render().decode()
    assert body.startswith(collector.text())
    rest = body[len(collector.text()) :]
    assert rest.startswith("# HELP python_gc_objects_collected_total") or rest.startswith(
        "# HELP process_"
    )
    assert "# TYPE python_info gauge" in rest
    whole = generate_latest(build_registry(collector)).decode()
    families = [line for line in whole.splitlines() if line.startswith("# TYPE")]
    assert [line for line in body.splitlines() if line.startswith("# TYPE")] == families
    assert Exposition(collector, process=False).render().decode() == collector.text()


def test_waiting_requests_by_reason_sum_to_the_waiting() -> None:
    metrics = StatsRecorder(make_core().config)
    metrics.snapshot = lambda: EngineSnapshot(1, 5, 0.5, num_deferred=2)
    text = _render(metrics, legacy=False)
    assert (
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0'
        in text
    )
    assert (
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 2.0'
        in text
    )
    assert 'vllm:num_requests_waiting{engine="0",model_name="m"} 5.0' in text


def test_kv_offload_config_info_states_the_cpu_tier() -> None:
    # vLLM 0.34's CPUOffloadingInfo: 16 chunks of one 4-token block, their bytes, and the
    # tokens they hold of max_model_len (512) requests: 16 × 512 // cdiv(512, 4) = 64; with
    # tiers, one series a tier, labelled as the tiering metrics are.
    config = make_core(num_cpu_blocks=16, offload_policy="write-through",
                       max_model_len=512).config  # fmt: skip
    assert config.block_size == 4
    text = _render(StatsRecorder(config), legacy=False)
    facts = (f'cpu_blocks_per_chunk="1",cpu_kv_cache_size_bytes="{16 * config.block_bytes}",'
             'cpu_kv_cache_size_tokens="64",cpu_num_chunks="16"')  # fmt: skip
    assert f'vllm:kv_offload_config_info{{{facts},engine="0",model_name="m"}} 1.0' in text
    fs = StorageTierSpec(StorageKind.FS, 64, read_gbps=8.0, write_gbps=4.0)
    tiered = _render(StatsRecorder(config.with_changes(storage_tiers=(fs,))), legacy=False)
    assert f'{facts},engine="0",model_name="m",tier="0:primary"}} 1.0' in tiered
    assert ('cpu_kv_cache_size_tokens="",cpu_num_chunks="",engine="0",model_name="m",'
            'tier="1:fs"} 1.0') in tiered  # fmt: skip
    assert "kv_offload_config_info" not in _render(StatsRecorder(make_core().config), legacy=False)


@pytest.mark.parametrize(
    ("release", "present", "absent"),
    [
        ("0.34", ['vllm:kv_offload_tiering_chunk_hits_total{engine="0",model_name="m",tier="1:fs"}',
                  'vllm:kv_offload_tiering_chunk_queries_total{engine="0",model_name="m",'
                  'tier="0:primary"}',
                  'vllm:kv_offload_tiering_write_bytes_total{engine="0",model_name="m",tier="1:fs"}'],
         ["vllm:kv_offload_tiering_block_hits", 'tier="fs"']),
        ("0.33", ['vllm:kv_offload_tiering_block_hits_total{engine="0",model_name="m",tier="fs"}',
                  'vllm:kv_offload_tiering_write_bytes_total{engine="0",model_name="m",tier="fs"}'],
         ["vllm:kv_offload_tiering_chunk_hits", "0:primary", "vllm:engine_sleep_state",
          "vllm:admission_rejections"]),
    ],
)  # fmt: skip
def test_tiering_names_and_labels_follow_the_release(
    release: str, present: list[str], absent: list[str]
) -> None:
    # --vllm-compat 0.33 keeps the names and labels 0.33-era dashboards read.
    fs = StorageTierSpec(StorageKind.FS, 64, read_gbps=8.0, write_gbps=4.0)
    config = make_core(num_cpu_blocks=16, offload_policy="write-through",
                       storage_tiers=(fs,)).config  # fmt: skip
    metrics = StatsRecorder(config, release=release)
    metrics.snapshot = lambda: EngineSnapshot(
        0, 0, 0.0, tiers=(TierSnapshot("fs", 0.5, 8, 4),),
        primary=TierSnapshot("primary", 0.25, 10, 2),
    )  # fmt: skip
    collector = MetricsCollector([metrics], "m", rejections=admission_counts())
    text = generate_latest(build_registry(collector, process=False)).decode()
    for line in present:
        assert line in text, line
    for fragment in absent:
        assert fragment not in text, fragment


@pytest.mark.parametrize("backend", [None, "lmcache", "native"])
def test_vllms_offload_families_are_its_offloading_connectors(backend: str | None) -> None:
    # No connector, or LMCacheConnectorV1: no vllm:kv_offload family (vLLM registers them
    # from OffloadingConnector only), and LMCache's hits are counted as an unspecified
    # external source. A prompt comes back from the CPU tier after two others evicted it.
    tier = {} if backend is None else {
        "num_cpu_blocks": 64, "offload_policy": "write-through", "offload_backend": backend,
        "sync_loads": backend == "lmcache"}  # fmt: skip
    core = make_core(num_gpu_blocks=16, max_model_len=64, max_num_batched_tokens=512, **tier)
    metrics = StatsRecorder(core.config, engine="0")
    prompts = [[1000 * (k + 1) + j for j in range(32)] for k in range(3)]
    requests = [req(f"r{k}", p, max_tokens=1, arrival=float(k)) for k, p in enumerate(prompts)]
    requests.append(req("again", prompts[0], max_tokens=1, arrival=3.0))
    for result in VirtualDriver(core).steps(requests):
        metrics.on_step(result)
    text = _render(metrics, legacy=False)
    assert ("vllm:kv_offload" in text) == (backend == "native")
    cpu_blocks = "64" if backend == "native" else "None"  # (LMCache's are not vLLM's)
    assert f'num_cpu_blocks="{cpu_blocks}"' in text
    source = 'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="{}"}}'
    hit = {None: None, "lmcache": "external_unspecified", "native": "host"}[backend]
    for name in ("host", "external_unspecified"):
        assert f"{source.format(name)} {28.0 if name == hit else 0.0}\n" in text
