"""The Grafana dashboard queries only metrics that a live mocker's /metrics exposes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import ServerThread, make_app

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/mocker.json"
NAME = re.compile(r"vllm:[A-Za-z0-9_:]+")
# What the dashboard must show (issue 7): queue depth, KV usage by tier, TTFT/ITL quantiles,
# prefix-cache hit rates (device and host tier), offload bandwidth.
REQUIRED = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:kv_offload_cpu_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_load_bytes_total",
}


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL text of the dashboard: panel targets and template-variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def exposed() -> dict[str, str]:
    """Sample name (as Prometheus stores it: `_total`, `_bucket`, … included) -> family type,
    from a real server with a host tier, after one request."""
    with ServerThread(make_app(num_cpu_blocks=256)) as srv:
        r = httpx.post(
            srv.url + "/v1/completions", json={"prompt": "Hello there", "max_tokens": 4}, timeout=30
        )
        assert r.status_code == 200, r.text
        text = httpx.get(srv.url + "/metrics", timeout=30).text
    return {s.name: f.type for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_dashboard_shows_what_the_rig_needs() -> None:
    queried = {name for q in _queries(_dashboard()) for name in NAME.findall(q)}
    assert REQUIRED - queried == set()


def test_every_queried_metric_is_exposed(exposed: dict[str, str]) -> None:
    queries = list(_queries(_dashboard()))
    assert len(queries) > 10
    missing = sorted({n for q in queries for n in NAME.findall(q)} - set(exposed))
    assert missing == []


def test_quantiles_read_histogram_buckets_and_rates_read_counters(exposed: dict[str, str]) -> None:
    for query in _queries(_dashboard()):
        for name in re.findall(r"histogram_quantile\([^,]+,[^)]*?(vllm:[\w:]+)", query):
            assert name.endswith("_bucket") and exposed[name] == "histogram", query
        for name in re.findall(r"\brate\((vllm:[\w:]+)", query):
            assert exposed[name] in ("counter", "histogram"), query  # never rate() a gauge


def test_panels_are_well_formed() -> None:
    dash = _dashboard()
    assert dash["uid"] == "mocker"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "model_name"} <= variables
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
