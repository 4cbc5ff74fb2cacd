"""The compose rig: three mocker replicas with distinct ports and KV-event topics, a Prometheus
that scrapes each of them, Grafana provisioned with that Prometheus and the dashboard, and the
"pd" profile's P/D example (one prefill, two decode replicas, LoRA adapters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from mocker.kvevents.config import KVEventsConfig
from mocker.settings import ALL_OPTIONS, engine_config_from, resolve, server_settings_from
from mocker.settings.lora import parse_lora_modules
from tests.support.settings import ALL, parse_flags, serve_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))  # resolves the << merge keys


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = _yaml(DEPLOY / "docker-compose.yml")
    return data


def _all_replicas() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    return {name: s for name, s in services.items() if s.get("image") == "mocker:latest"}


def _replicas() -> dict[str, dict[str, Any]]:
    """The default rig's replicas (the P/D ones run only with their profile)."""
    return {name: s for name, s in _all_replicas().items() if not s.get("profiles")}


def test_the_fleet_profile_publishes_every_servers_port() -> None:
    fleet = _all_replicas()["mocker-fleet"]
    env = fleet["environment"]
    first, count = int(env["MOCKER_PORT"]), int(env["MOCKER_REPLICAS"])
    assert fleet["profiles"] == ["fleet"]
    assert fleet["ports"] == [f"{first}-{first + count - 1}:{first}-{first + count - 1}"]
    values = resolve(parse_flags([]), ALL, environ={k: str(v) for k, v in env.items()})[0]
    settings = server_settings_from(values)
    assert (settings.port, settings.replicas) == (first, count)
    engine_config_from(values)  # the engine settings are valid too


def _pd_replicas() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in _all_replicas().items() if "pd" in s.get("profiles", [])}


def _published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port."""
    pairs = (str(p).split(":") for p in service["ports"])
    return {int(inner): int(outer) for outer, inner in pairs}


def test_three_replicas_built_from_the_repo_dockerfile() -> None:
    replicas = _replicas()
    assert len(replicas) == 3
    for name, s in replicas.items():
        assert s["hostname"] == name
        assert (DEPLOY / s["build"]["context"] / s["build"]["dockerfile"]).is_file()


def test_replicas_publish_distinct_host_ports() -> None:
    published = [_published(s) for s in _replicas().values()]
    for ports in published:
        assert set(ports) == {8000, 5557}  # HTTP and KV events inside each container
    host_ports = [p for ports in published for p in ports.values()]
    assert len(host_ports) == len(set(host_ports))


def test_every_env_var_is_a_mocker_setting() -> None:
    known = {o.env for o in ALL_OPTIONS.values()}
    for name, s in _all_replicas().items():
        env = s["environment"]
        assert {k for k in env if k.startswith("MOCKER_")} <= known, name


def test_kv_event_topics_name_each_replica() -> None:
    topics = set()
    for name, s in _replicas().items():
        env = s["environment"]
        config = KVEventsConfig.parse(env["MOCKER_KV_EVENTS_CONFIG"])  # as mocker reads it
        assert config.active
        assert config.endpoint == "tcp://*:5557"
        topic = config.topic_for(host="ignored", port=8000, model=env["MOCKER_MODEL"])
        assert topic == f"kv@{name}:8000@{env['MOCKER_MODEL']}"
        topics.add(topic)
    assert len(topics) == 3


def test_prometheus_scrapes_every_replica() -> None:
    prometheus = _compose()["services"]["prometheus"]
    source, target = prometheus["volumes"][0].split(":")[:2]
    assert target in " ".join(prometheus["command"])
    config = _yaml(DEPLOY / source)
    targets = {
        t
        for job in config["scrape_configs"]
        if job.get("metrics_path", "/metrics") == "/metrics"
        for static in job["static_configs"]
        for t in static["targets"]
    }
    fleet = _all_replicas()["mocker-fleet"]
    first, count = (
        int(fleet["environment"]["MOCKER_PORT"]),
        int(fleet["environment"]["MOCKER_REPLICAS"]),
    )
    servers = {f"{name}:8000" for name in _all_replicas() if name != "mocker-fleet"}
    assert targets == servers | {f"mocker-fleet:{first + i}" for i in range(count)}


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provisioning = DEPLOY / next(s for s, t in mounts.items() if t == "/etc/grafana/provisioning")
    (source,) = _yaml(provisioning / "datasources/prometheus.yml")["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    (provider,) = _yaml(provisioning / "dashboards/mocker.yml")["providers"]
    dashboards = next(s for s, t in mounts.items() if t == provider["options"]["path"])
    assert (DEPLOY / dashboards / "mocker.json").is_file()


def test_pd_profile_runs_one_prefill_and_two_decode_replicas_with_lora() -> None:
    replicas = _pd_replicas()
    roles = {}
    for name, s in replicas.items():
        env = s["environment"]
        transfer = json.loads(env["MOCKER_KV_TRANSFER_CONFIG"])
        assert transfer["kv_connector"] == "NixlConnector"
        config = serve_config("--kv-transfer-config", env["MOCKER_KV_TRANSFER_CONFIG"])
        roles[name] = config.transfer.kv_role.value
        assert env["MOCKER_ENABLE_LORA"] == "true" and env["MOCKER_MAX_LORAS"] == "2"
        modules = parse_lora_modules(env["MOCKER_LORA_MODULES"].split(","))
        assert [m.name for m in modules] == ["sql-lora", "chat-lora"]
        assert s["hostname"] == name
    assert roles == {"mocker-prefill": "kv_producer", "mocker-decode-1": "kv_consumer",
                     "mocker-decode-2": "kv_consumer"}  # fmt: skip
    prefill = replicas["mocker-prefill"]["environment"]
    # The decode replicas dial the prefill replica by its name inside the network.
    assert prefill["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "mocker-prefill"
    host_ports = [p for s in replicas.values() for p in _published(s).values()]
    others = [p for s in _replicas().values() for p in _published(s).values()]
    assert len(set(host_ports)) == 3 and not set(host_ports) & set(others)
