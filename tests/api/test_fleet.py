"""`mocker serve --replicas N`: N whole servers in one process, each on its own port."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import httpx
import pytest
import zmq

from mocker.api.fleet import check_replicas, raise_open_files, replica_settings
from mocker.config import EngineConfig
from mocker.errors import ConfigError
from mocker.kvevents.config import KVEventsConfig
from mocker.settings import ServerSettings
from tests.api.test_routers import VLLM_ROUTER, router_argv, start_router
from tests.support.parsing import samples
from tests.support.servers import LoggedProcess, serve, stderr_of
from tests.support.tool_venv import tool_venv

REPLICAS = 3
ADMIN = "s3cret"
KV_EVENTS = json.dumps(
    {"enable_kv_cache_events": True, "publisher": "zmq",
     "endpoint": "tcp://127.0.0.1:*", "topic": "kv@{host}:{port}@{model}"}
)  # fmt: skip
PORTS = re.compile(r"mocker: (\d+) replicas on ports (\S+)")


def replica_urls_of(proc: LoggedProcess, first: str, count: int) -> list[str]:
    """Every replica's URL, from the start-up lines (the first names replica 0's)."""
    found = PORTS.search(stderr_of(proc))
    assert found is not None, stderr_of(proc)
    host = first.rsplit(":", 1)[0]
    ports = found[2].split(",")
    assert int(found[1]) == len(ports) == count
    assert first == f"{host}:{ports[0]}"
    return [f"{host}:{port}" for port in ports]


@pytest.fixture(scope="module")
def fleet() -> Iterator[list[str]]:
    args = ("--replicas", str(REPLICAS), "--admin-token", ADMIN, "--kv-events-config", KV_EVENTS)
    with serve(*args) as (proc, url):
        yield replica_urls_of(proc, url, REPLICAS)


def _completion(url: str) -> httpx.Response:
    body = {"model": "mocker", "prompt": "one two three four", "max_tokens": 4}
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def _successes(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(samples(text, "vllm:request_success_total").values())


def test_each_replica_serves_and_counts_its_own_requests(fleet: list[str]) -> None:
    before = [_successes(u) for u in fleet]
    for i, url in enumerate(fleet):
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        for _ in range(i + 1):
            assert _completion(url).status_code == 200
    after = [_successes(u) for u in fleet]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 2, 3]


def test_faults_are_each_replicas_own(fleet: list[str]) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    change = httpx.post(fleet[1] + "/admin/config", json={"failure_rate": 1.0}, headers=auth,
                        timeout=10)  # fmt: skip
    assert change.status_code == 200
    try:
        assert _completion(fleet[1]).status_code >= 400
        assert _completion(fleet[0]).status_code == 200
        assert _completion(fleet[2]).status_code == 200
        assert httpx.get(fleet[0] + "/admin/config", headers=auth).json()["failure_rate"] == 0
    finally:
        httpx.post(fleet[1] + "/admin/config", json={"failure_rate": 0.0}, headers=auth)


def test_each_replica_publishes_its_kv_events_on_its_own_socket(fleet: list[str]) -> None:
    sources = [httpx.get(u + "/kv_event_sources", timeout=10).json() for u in fleet]
    text = json.dumps(sources)
    endpoints = re.findall(r"tcp://127\.0\.0\.1:\d+", text)
    assert len(set(endpoints)) >= REPLICAS, sources
    # A subscriber of replica 2 sees its stores, and none of replica 0's.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    try:
        own = re.findall(r"tcp://127\.0\.0\.1:\d+", json.dumps(sources[2]))[0]
        sub.connect(own)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        port2 = fleet[2].rsplit(":", 1)[1]
        got: list[bytes] = []
        for _ in range(50):  # until the subscription has reached the publisher
            assert _completion(fleet[2]).status_code == 200
            if sub.poll(200):
                got = sub.recv_multipart()
                break
        assert got, "no KV events from replica 2"
        assert got[0].decode().startswith(f"kv@127.0.0.1:{port2}@")
    finally:
        sub.close(linger=0)


def _kv(replay_port: int) -> KVEventsConfig:
    return KVEventsConfig.parse(json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
         "replay_endpoint": f"tcp://*:{replay_port}"}
    ))  # fmt: skip


def test_replica_settings_move_kv_event_ports_past_the_ranks_before() -> None:
    kv = _kv(6000)
    settings = ServerSettings(kv_events=kv, data_parallel_size=2)
    assert replica_settings(settings, 0, 8000).kv_events.endpoint == "tcp://*:5557"
    third = replica_settings(settings, 2, 8002)
    assert third.port == 8002
    assert third.kv_events.endpoint == "tcp://*:5561"  # ranks 0-1, 2-3 before it
    assert third.kv_events.replay_endpoint == "tcp://*:6004"


def test_what_replicas_cannot_share_is_refused() -> None:
    kv = _kv(5560)
    with pytest.raises(ConfigError, match="overlap"):
        check_replicas(ServerSettings(replicas=4, kv_events=kv), EngineConfig())
    check_replicas(ServerSettings(replicas=3, kv_events=kv), EngineConfig())
    producer = EngineConfig.of(kv_role="kv_producer")
    with pytest.raises(ConfigError, match="--replicas: not with a P/D"):
        check_replicas(ServerSettings(replicas=2), producer)
    check_replicas(ServerSettings(replicas=1), producer)


def test_a_fleet_too_big_for_the_open_files_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 2048))
    monkeypatch.setattr(resource, "setrlimit", lambda *_: None)
    raise_open_files(100)
    with pytest.raises(ConfigError, match="--replicas 1000: needs about 16064 open files"):
        raise_open_files(1000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--replicas", "0"), "invalid replicas=0: must be in [1, 4096]"),
        (("--replicas", "10", "--port", "65530"), "from port 65530 past port 65535"),
    ],
)
def test_bad_replica_counts_are_one_line(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mocker.cli import main

    assert main(["serve", "--timing-model", "polynomial", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_replicas_is_a_server_setting() -> None:
    assert replace(ServerSettings(), replicas=5).replicas == 5


def test_vllm_router_spreads_requests_over_the_replicas_of_one_process(
    fleet: list[str],
) -> None:
    bin_dir = tool_venv("vllm-router", VLLM_ROUTER)
    before = [_successes(u) for u in fleet]
    argv = partial(router_argv, "vllm", "round_robin", urls=fleet, bin_dir=bin_dir)
    with start_router(lambda port: argv(port=port), workers=REPLICAS) as proxy:
        answers = [_completion(proxy.url) for _ in range(3 * REPLICAS)]
    assert [a.status_code for a in answers] == [200] * 3 * REPLICAS
    served = [_successes(u) - b for u, b in zip(fleet, before, strict=True)]
    assert served == [3] * REPLICAS


def test_sigterm_stops_every_replica_and_exits_0() -> None:
    with serve("--replicas", "2") as (proc, url):
        urls = replica_urls_of(proc, url, 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        for u in urls:
            with pytest.raises(httpx.HTTPError):
                httpx.get(u + "/health", timeout=2)
        assert "Traceback" not in stderr_of(proc)


def test_a_dialled_endpoint_is_every_replicas_and_the_topics_tell_them_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kv = KVEventsConfig.parse(json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://indexer:5557",
         "replay_endpoint": "tcp://*:6000", "topic": "kv@{host}:{port}@{model}"}
    ))  # fmt: skip
    settings = ServerSettings(kv_events=kv, replicas=3)
    third = replica_settings(settings, 2, 8002)
    assert third.kv_events.endpoint == "tcp://indexer:5557"  # a consumer binds it
    assert third.kv_events.replay_endpoint == "tcp://*:6002"  # always bound: moved
    check_replicas(settings, EngineConfig())
    assert not caplog.records
    no_port = replace(settings, kv_events=replace(kv, topic="kv@{model}"))
    with caplog.at_level("WARNING", logger="mocker"):
        check_replicas(no_port, EngineConfig())
    assert "told apart by topic" in caplog.text


def test_http_and_kv_event_ports_must_not_meet() -> None:
    kv = _kv(6000)  # endpoint tcp://*:5557
    with pytest.raises(ConfigError, match=r"HTTP ports 5550-5559 and kv_events_config\.endpoint"):
        check_replicas(ServerSettings(port=5550, replicas=10, kv_events=kv), EngineConfig())
    check_replicas(ServerSettings(port=8000, replicas=10, kv_events=kv), EngineConfig())


def test_room_is_made_for_every_replicas_zmq_sockets() -> None:
    kv = KVEventsConfig.parse(json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*",
         "replay_endpoint": "tcp://127.0.0.1:*"}
    ))  # fmt: skip
    check_replicas(ServerSettings(replicas=1200, kv_events=kv, port=0), EngineConfig())
    assert zmq.Context.instance().get(zmq.MAX_SOCKETS) >= 2400
