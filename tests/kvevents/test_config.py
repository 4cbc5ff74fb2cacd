"""--kv-events-config: vLLM's keys and defaults, errors naming the key, endpoints and topics."""

from __future__ import annotations

import pytest

from mocker.config import ConfigError
from mocker.kvevents.config import (
    KVEventsConfig,
    advertised_host,
    binds,
    connectable,
    offset_endpoint,
    wildcard_port,
    with_port,
)


def test_defaults_are_vllms() -> None:
    config = KVEventsConfig.parse(None)
    assert config == KVEventsConfig.parse("") == KVEventsConfig.parse("{}")
    assert config.enable_kv_cache_events is False and not config.active
    assert config.publisher == "zmq"
    assert config.endpoint == "tcp://*:5557"
    assert config.replay_endpoint is None
    assert (config.buffer_steps, config.hwm, config.max_queue_size) == (10_000, 100_000, 100_000)
    assert config.topic == ""


def test_parse_json_and_mapping() -> None:
    text = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://indexer:5557",'
        ' "replay_endpoint": "tcp://*:5558", "buffer_steps": 50, "hwm": 7, "topic": "kv"}'
    )
    config = KVEventsConfig.parse(text)
    assert config.active and config.endpoint == "tcp://indexer:5557"
    assert (config.replay_endpoint, config.buffer_steps, config.hwm) == ("tcp://*:5558", 50, 7)
    assert KVEventsConfig.parse({"enable_kv_cache_events": True, "topic": "kv"}).topic == "kv"
    null = KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "null"}')
    assert not null.active  # vLLM's NullEventPublisher: nothing is published


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"enable_kv_cache_events": true,', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"endpont": "tcp://*:1"}', "unknown key 'endpont'"),
        ('{"enable_kv_cache_events": "yes"}', "kv_events_config.enable_kv_cache_events"),
        ('{"publisher": "kafka"}', "kv_events_config.publisher"),
        ('{"endpoint": "localhost:5557"}', "kv_events_config.endpoint"),
        ('{"endpoint": "tcp://*:99999"}', "kv_events_config.endpoint"),
        ('{"endpoint": "tcp://*:0"}', "or * for a free one"),
        ('{"endpoint": "tcp://*:**"}', "kv_events_config.endpoint"),
        ('{"replay_endpoint": "tcp://*:"}', "kv_events_config.replay_endpoint"),
        ('{"endpoint": "udp://*:5557"}', "kv_events_config.endpoint"),
        ('{"replay_endpoint": 5558}', "kv_events_config.replay_endpoint"),
        ('{"buffer_steps": 0}', "kv_events_config.buffer_steps"),
        ('{"hwm": "lots"}', "kv_events_config.hwm"),
        ('{"hwm": 2147483648}', "kv_events_config.hwm"),
        ('{"buffer_steps": 2000000000}', "kv_events_config.buffer_steps"),
        ('{"topic": "kv@{host!x}"}', "cannot be filled in"),
        ('{"topic": "kv@{host:d}"}', "cannot be filled in"),
        ('{"topic": "kv@{0}"}', "kv_events_config.topic"),
        ('{"max_queue_size": true}', "kv_events_config.max_queue_size"),
        ('{"topic": 3}', "kv_events_config.topic"),
        ('{"topic": "kv@{pod}"}', "unknown placeholder {pod}"),
        ('{"topic": "kv@{host"}', "kv_events_config.topic"),
    ],
)
def test_bad_config_names_the_key(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match="kv_events_config") as info:
        KVEventsConfig.parse(text)
    assert named in str(info.value)


def test_bind_or_connect_as_vllm() -> None:
    assert binds("tcp://*:5557") and binds("tcp://[::]:5557")
    assert binds("ipc:///tmp/kv") and binds("inproc://kv")
    assert not binds("tcp://indexer:5557") and not binds("tcp://10.0.0.1:5557")
    # mocker's prefix: bind this exact address
    assert binds("bind+tcp://127.0.0.1:5557") and binds("bind+tcp://10.0.0.1:5557")


def test_bind_prefix_keeps_vllms_rank_offsets_and_checks() -> None:
    config = KVEventsConfig.parse('{"endpoint": "bind+tcp://127.0.0.1:5557"}')
    assert config.endpoint_for(2) == "bind+tcp://127.0.0.1:5559"
    assert KVEventsConfig(endpoint="bind+tcp://127.0.0.1:*").endpoint_for(2).endswith(":*")
    with pytest.raises(ConfigError, match="overlap"):
        KVEventsConfig(
            endpoint="bind+tcp://127.0.0.1:5557", replay_endpoint="tcp://*:5558"
        ).check_ranks(2)
    with pytest.raises(ConfigError, match="port in"):
        KVEventsConfig(endpoint="bind+tcp://127.0.0.1:0x")


def test_data_parallel_rank_offsets_the_port() -> None:
    config = KVEventsConfig(endpoint="tcp://*:5557", replay_endpoint="tcp://*:6000")
    assert config.endpoint_for(0) == "tcp://*:5557"
    assert config.endpoint_for(3) == "tcp://*:5560"
    assert config.replay_endpoint_for(2) == "tcp://*:6002"
    assert KVEventsConfig().replay_endpoint_for(2) is None
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    with pytest.raises(ConfigError, match="port 65536"):
        offset_endpoint("tcp://*:65535", 1)


def test_ranks_whose_bound_ports_collide_are_refused() -> None:
    close = KVEventsConfig(endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558")
    close.check_ranks(1)  # one rank: 5557 and 5558 are fine
    with pytest.raises(ConfigError, match=r"overlap.*replay_endpoint tcp://\*:5560"):
        close.check_ranks(2)  # rank 1 would publish on 5558, rank 0's replay port
    KVEventsConfig(endpoint="tcp://*:5557", replay_endpoint="tcp://*:5560").check_ranks(3)
    # The engine connects (the consumer binds): nothing of rank r's publisher is bound here.
    KVEventsConfig(endpoint="tcp://10.0.0.1:5557", replay_endpoint="tcp://*:5558").check_ranks(4)
    with pytest.raises(ConfigError, match="port 65536"):
        KVEventsConfig(endpoint="tcp://*:65534").check_ranks(3)


def test_topic_placeholders_give_llm_d_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    config = KVEventsConfig(topic="kv@{host}:{port}@{model}")
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    host = advertised_host("0.0.0.0")
    assert config.topic_for(host=host, port=8000, model="llama") == "kv@10.1.2.3:8000@llama"
    assert KVEventsConfig(topic="{{x}}").topic_for(host="h", port=1, model="m") == "{x}"
    monkeypatch.delenv("POD_IP")
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    assert advertised_host("0.0.0.0") not in ("", "0.0.0.0")


def test_connectable_fills_wildcard_host() -> None:
    assert connectable("tcp://*:5557", "10.0.0.7") == "tcp://10.0.0.7:5557"
    assert connectable("tcp://0.0.0.0:5557", "10.0.0.7") == "tcp://10.0.0.7:5557"
    assert connectable("tcp://[::]:5557", "fe80::1") == "tcp://[fe80::1]:5557"
    assert connectable("tcp://1.2.3.4:5557", "10.0.0.7") == "tcp://1.2.3.4:5557"
    assert connectable("ipc:///tmp/kv", "10.0.0.7") == "ipc:///tmp/kv"


def test_a_wildcard_port_is_bound_per_rank_to_a_port_the_system_picks() -> None:
    # ZMQ's `*` port: the system picks a free one at bind time. It has a `*`, so it is bound
    # (vLLM's rule); every data-parallel rank binds its own free port, not port + rank.
    config = KVEventsConfig.parse(
        '{"endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://*:*"}'
    )
    assert binds(config.endpoint) and wildcard_port(config.endpoint)
    assert config.endpoint_for(3) == "tcp://127.0.0.1:*"
    assert config.replay_endpoint_for(2) == "tcp://*:*"
    assert not wildcard_port("tcp://*:5557") and not wildcard_port("ipc:///tmp/kv:*")
    assert with_port("tcp://*:*", 40123) == "tcp://*:40123"
    assert with_port("tcp://[::1]:*", 40123) == "tcp://[::1]:40123"
    assert connectable("tcp://*:40123", "10.0.0.7") == "tcp://10.0.0.7:40123"
    # No port of a wildcard can collide with another rank's, whatever the other one is.
    config.check_ranks(8)
    KVEventsConfig(endpoint="tcp://*:5557", replay_endpoint="tcp://*:*").check_ranks(8)
    KVEventsConfig(endpoint="tcp://*:*", replay_endpoint="tcp://*:5558").check_ranks(8)
    # A numeric port next to a wildcard one is still offset (and checked) per rank.
    with pytest.raises(ConfigError, match="port 65536"):
        KVEventsConfig(endpoint="tcp://*:*", replay_endpoint="tcp://*:65535").check_ranks(2)
