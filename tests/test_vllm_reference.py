"""mocker against vLLM 0.34.0's own source: metric families (names, types, labels, help,
buckets), KV-event field order and cache-hit sources, as tools/vllm_reference.py read them
from the release's wheel into tests/data/vllm_0.34.0_reference.json (CI checks that file
against the wheel)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mocker.engine.stats import EngineSnapshot
from mocker.kvevents import wire
from mocker.metrics.families import FAMILIES, NIXL_FAMILIES, Family
from mocker.metrics.histogram import Histogram
from mocker.metrics.recorder import StatsRecorder
from mocker.metrics.sources import CACHE_HIT_SOURCES
from tests.support.engines import make_core
from tests.support.kv_consumer import wire_types

REFERENCE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "vllm_0.34.0_reference.json").read_text()
)
METRICS = {m["name"]: m for m in REFERENCE["metrics"]}
BUCKETS: dict[str, list[float] | None] = REFERENCE["histogram_bucket_families"]
# Families whose help mocker words differently on purpose (none today: add one with why).
OWN_HELP: set[str] = set()
SERVED = [f for f in (*FAMILIES, *NIXL_FAMILIES) if not f.legacy and f.release != "0.33"]


def _labels(reference: dict[str, Any]) -> list[str]:
    engine = REFERENCE["engine_labels"]
    names: list[str] = reference["labelnames"]
    return [n for name in names for n in (engine if name == "<engine labels>" else [name])]


def _bounds(family: Family) -> tuple[float, ...] | None:
    """A histogram family's bucket bounds, from a fresh recorder (None: not a histogram)."""
    value = family.source(StatsRecorder(make_core().config), EngineSnapshot(0, 0, 0.0))
    if isinstance(value, Histogram):
        return value.bounds
    if value and isinstance(value, list) and isinstance(value[0][1], Histogram):
        return value[0][1].bounds
    return None


def test_the_reference_is_vllm_034() -> None:
    assert REFERENCE["vllm_version"] == "0.34.0"


@pytest.mark.parametrize("family", SERVED, ids=lambda f: f.name)
def test_a_served_family_is_vllm_034s(family: Family) -> None:
    reference = METRICS.get(family.name)
    assert reference is not None, f"{family.name} is not a vLLM 0.34 family"
    assert reference["type"] == family.kind.value
    own = [] if family.label is None else [family.label]
    assert _labels(reference) == ["model_name", "engine", *own]
    if family.name not in OWN_HELP:
        assert reference["documentation"] in (None, family.help)
    bounds = _bounds(family)
    expected = reference.get("buckets")
    if expected is None and reference.get("bucket_family"):
        expected = BUCKETS[reference["bucket_family"]]
    if bounds is not None and isinstance(expected, list):
        assert list(bounds) == [float(b) for b in expected]


def test_the_033_and_legacy_forms_are_not_034_families() -> None:
    old = {f.name for f in FAMILIES if f.legacy or f.release == "0.33"}
    assert old - {f.name for f in SERVED} & set(METRICS) == set()


def test_cache_hit_sources_are_vllms_in_order() -> None:
    assert list(CACHE_HIT_SOURCES) == [s["value"] for s in REFERENCE["cache_hit_source"]]


def _fields(struct: str) -> list[tuple[str, bool]]:
    return [
        (f["name"], f["has_default"]) for f in REFERENCE["kv_events"]["structs"][struct]["fields"]
    ]


def test_the_wire_writes_vllms_fields_in_order() -> None:
    stored = _fields("BlockStored")
    assert [n for n, optional in stored if optional] == list(wire._STORED_TAIL)
    assert [n for n, optional in stored if not optional] == [
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name",
    ]  # fmt: skip
    removed = _fields("BlockRemoved")
    assert [n for n, optional in removed if optional] == list(wire._REMOVED_TAIL)
    assert [n for n, optional in removed if not optional] == ["block_hashes", "medium"]
    assert _fields("AllBlocksCleared") == []
    assert _fields("EventBatch") == [("ts", False), ("events", False), ("data_parallel_rank", True)]
    options = REFERENCE["kv_events"]["structs"]["BlockStored"]["options"]
    assert options["omit_defaults"] and options["tag"] and not options.get("array_like")


def test_the_test_decoder_is_vllms_layout() -> None:
    # tests.support.kv_consumer's structs (which every KV-event test decodes with) are vLLM
    # 0.34's, field for field: a field mocker writes that vLLM lacks fails those decodes.
    _, events = wire_types(array_like=False)
    for struct in events:
        info = msgspec.structs.fields(struct)
        mine = [(f.name, f.default is not msgspec.NODEFAULT) for f in info]
        assert mine == _fields(struct.__name__), struct.__name__


def test_the_families_outside_the_table_are_vllm_034s() -> None:
    # The API server's admission rejections and the tiering promotion latency: type, help,
    # labels and buckets as vLLM 0.34 declares them.
    from mocker.metrics.prometheus import MetricsCollector
    from mocker.metrics.sources import admission_counts
    from mocker.storage_spec import StorageKind, StorageTierSpec

    fs = StorageTierSpec(StorageKind.FS, 64, read_gbps=8.0, write_gbps=4.0)
    config = make_core(num_cpu_blocks=16, offload_policy="write-through",
                       storage_tiers=(fs,)).config  # fmt: skip
    metrics = StatsRecorder(config)
    metrics.promotion_latency[("fs", "success")] = Histogram(
        (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    )
    collector = MetricsCollector([metrics], "m", rejections=admission_counts())
    checked = set()
    for family in collector.collect():
        reference = METRICS.get(family.name)
        if reference is None or family.name in {f.name for f in FAMILIES}:
            continue
        if family.name in ("vllm:cache_config_info", "vllm:lora_requests_info"):
            continue
        checked.add(family.name)
        assert (
            reference["type"] == family.type and reference["documentation"] == family.documentation
        )
        if reference["labelnames"] is None:
            continue  # (declared at run time: vllm:kv_offload_config_info, tested with mocker's)
        sample = family.samples[0]
        labels = [k for k in sample.labels if k != "le"]
        assert sorted(labels) == sorted(_labels(reference)), family.name
        if family.type == "histogram":
            les = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            assert les[:-1] == [float(b) for b in reference["buckets"]]
    assert checked == {"vllm:admission_rejections", "vllm:kv_offload_config_info",
                       "vllm:kv_offload_tiering_promotion_latency_seconds"}  # fmt: skip


def test_the_connectors_are_the_ones_vllm_034_registers() -> None:
    from mocker.settings.kv_transfer import CONNECTORS, NO_HMA_CONNECTORS

    assert sorted(CONNECTORS) == sorted(REFERENCE["kv_connectors"])
    assert set(NO_HMA_CONNECTORS) <= set(CONNECTORS)


def test_every_offload_key_vllm_034_reads_is_accepted() -> None:
    # An OffloadingConnector / TieringOffloadingSpec config copied from vLLM 0.34 starts: every
    # extra-config key its source reads, and every key its fs and obj tiers and their factory
    # read, is one mocker takes (or accepts without a use).
    from mocker.settings import kv_transfer as kt
    from mocker.settings import secondary_tiers as st

    offload = REFERENCE["offload_config"]
    accepted = kt._EXTRA_KEYS | kt._EXTRA_IGNORED
    assert set(offload["extra_config_keys"]) <= accepted
    tier = st._TIER_KEYS | st._TIER_IGNORED
    read = set(offload["tier_keys_read_by_factory_and_spec"]) - {"backpressure_cls", "policy_cls"}
    for kind in ("fs", "obj"):
        read |= set(offload["tier_types"][kind]["keys"])
    assert read <= tier, read - tier
