"""`--kv-events-config`: vLLM's KVEventsConfig keys and defaults, endpoints and the topic.

A tcp endpoint's port may be ZMQ's wildcard `*` (`tcp://*:*`, `tcp://127.0.0.1:*`): the
system picks a free port when the socket is bound, and the publisher reports the endpoint
with that port (GET /kv_event_sources). Such an endpoint is always bound (it has a `*`);
with data parallelism each rank binds its own free port instead of port + rank.

vLLM binds only wildcard, ipc and inproc endpoints and connects to every other one, so
`tcp://127.0.0.1:5557` is dialled, never bound. Mocker's `bind+` prefix
(`bind+tcp://127.0.0.1:5557`) binds exactly that address (a loopback-only rig, a router
that wants a concrete `tcp://HOST:PORT`); the endpoint is reported without the prefix.
"""

from __future__ import annotations

import json
import os
import socket
import string
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from mocker.config import ConfigError

__all__ = [
    "BIND_PREFIX",
    "EventFormat",
    "KVEventsConfig",
    "advertised_host",
    "binds",
    "connectable",
    "offset_endpoint",
    "wildcard_port",
    "with_port",
]

_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*", "[::]")
BIND_PREFIX = "bind+"  # mocker: bind this exact endpoint (vLLM would connect to it)
TOPIC_PLACEHOLDERS = ("host", "port", "model")


class EventFormat(StrEnum):
    """How each event is laid out in the msgpack payload."""

    MAP = "map"  # vLLM >= mid-2026: a map with "type" = the event's class name
    ARRAY = "array"  # the older positional layout: ["BlockStored", field, field, ...]


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's KVEventsConfig, key for key, with its defaults."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"  # "zmq" or "null" (vLLM's two publishers)
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            _bad("enable_kv_cache_events", self.enable_kv_cache_events, "must be true or false")
        if self.publisher not in ("zmq", "null"):
            _bad("publisher", self.publisher, 'must be "zmq" or "null"')
        _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_endpoint("replay_endpoint", self.replay_endpoint)
        for name, lo, hi in (
            ("buffer_steps", 1, 100_000_000),  # replayed batches are kept in memory
            ("hwm", 0, 2**31 - 1),  # a ZMQ socket option (0: no limit)
            ("max_queue_size", 1, 100_000_000),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                _bad(name, value, f"must be an integer in [{lo}, {hi}]")
        if not isinstance(self.topic, str):
            _bad("topic", self.topic, "must be a string")
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(self.topic) if f is not None}
        except ValueError as exc:
            _bad("topic", self.topic, f"is not a valid template ({exc}; write {{{{ for a brace)")
        unknown = sorted(names - set(TOPIC_PLACEHOLDERS))
        if unknown:
            _bad(
                "topic",
                self.topic,
                f"unknown placeholder {{{unknown[0]}}}: use "
                + ", ".join("{" + p + "}" for p in TOPIC_PLACEHOLDERS),
            )
        try:  # conversions and format specs ({host!x}, {host:d}) fail only when filled in
            self.topic_for(host="10.0.0.1", port=8000, model="model")
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
            _bad("topic", self.topic, f"cannot be filled in ({exc})")

    @property
    def active(self) -> bool:
        """Events are recorded and published."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] | None) -> KVEventsConfig:
        """From the flag's JSON text (or a YAML mapping); errors name the offending key."""
        if value is None:
            return cls()
        if isinstance(value, str):
            if not value.strip():
                return cls()
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"invalid kv_events_config: not valid JSON ({exc.msg} at line {exc.lineno} "
                    f"column {exc.colno}); expected an object such as "
                    '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}\''
                ) from None
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"invalid kv_events_config={value!r}: must be a JSON object of setting: value"
            )
        known = [f.name for f in fields(cls)]
        for key in value:
            if key not in known:
                raise ConfigError(
                    f"invalid kv_events_config: unknown key {key!r} (known keys: "
                    + ", ".join(known)
                    + ")"
                )
        return cls(**dict(value))

    def endpoint_for(self, rank: int) -> str:
        """The PUB endpoint of data-parallel rank `rank` (port + rank, as vLLM; a wildcard
        port stays a wildcard: each rank binds a free port of its own)."""
        return offset_endpoint(self.endpoint, rank)

    def replay_endpoint_for(self, rank: int) -> str | None:
        if self.replay_endpoint is None:
            return None
        return offset_endpoint(self.replay_endpoint, rank)

    def check_ranks(self, size: int) -> None:
        """Refuse a layout where the ranks' bound ports collide: rank r binds endpoint port + r
        and replay port + r, so the two ranges must not overlap. (A wildcard port cannot
        collide: the system hands each rank's socket a free port.)"""
        for rank in range(size):  # ports past 65535 fail here, before anything binds
            self.endpoint_for(rank)
            self.replay_endpoint_for(rank)
        replay = self.replay_endpoint
        if size < 2 or replay is None or not binds(self.endpoint):
            return
        endpoint, replay = self.endpoint.removeprefix(BIND_PREFIX), replay.removeprefix(BIND_PREFIX)
        if not (endpoint.startswith("tcp://") and replay.startswith("tcp://")):
            return
        if wildcard_port(endpoint) or wildcard_port(replay):
            return
        pub = int(endpoint.rpartition(":")[2])
        rep = int(replay.rpartition(":")[2])
        if abs(pub - rep) < size:
            free = max(pub, rep) + size
            raise ConfigError(
                f"kv_events_config: with data_parallel_size {size}, rank r binds "
                f"endpoint port {pub} + r and replay_endpoint port {rep} + r, and these "
                f"overlap; move one of them at least {size} ports from the other (e.g. "
                f"replay_endpoint tcp://*:{free})"
            )

    def topic_for(self, *, host: str, port: int, model: str) -> str:
        """The topic with {host}, {port} and {model} filled in (llm-d wants
        "kv@{host}:{port}@{model}")."""
        return self.topic.format(host=host, port=port, model=model)


def _bad(key: str, value: Any, why: str) -> None:
    raise ConfigError(f"invalid kv_events_config.{key}={value!r}: {why}")


def _check_endpoint(key: str, endpoint: Any) -> None:
    if isinstance(endpoint, str):
        endpoint = endpoint.removeprefix(BIND_PREFIX)
    if not isinstance(endpoint, str) or "://" not in endpoint:
        _bad(key, endpoint, 'must be a ZMQ endpoint such as "tcp://*:5557" or "ipc:///tmp/kv"')
    scheme = endpoint.split("://", 1)[0]
    if scheme not in ("tcp", "ipc", "inproc"):
        _bad(key, endpoint, "the transport must be tcp, ipc or inproc")
    if scheme == "tcp":
        _, _, port = endpoint.rpartition(":")
        if port != "*" and (not port.isdigit() or not 0 < int(port) < 65536):
            _bad(key, endpoint, "a tcp endpoint needs a port in [1, 65535], or * for a free one")


def wildcard_port(endpoint: str) -> bool:
    """A tcp endpoint whose port is ZMQ's `*`: bound to a port the system picks."""
    return endpoint.removeprefix(BIND_PREFIX).startswith("tcp://") and endpoint.endswith(":*")


def with_port(endpoint: str, port: int) -> str:
    """`endpoint` with its tcp port replaced by `port` (the host kept as written)."""
    base, _, _ = endpoint.rpartition(":")
    return f"{base}:{port}"


def offset_endpoint(endpoint: str, rank: int) -> str:
    """vLLM's rule: data-parallel rank r publishes on port + r (inproc: a `_dp{r}` suffix,
    ipc: the same suffix, since a path has no port). A wildcard port is left as it is:
    every rank's socket gets a free port of its own when it binds."""
    if rank == 0 or wildcard_port(endpoint):
        return endpoint
    if endpoint.removeprefix(BIND_PREFIX).startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        new_port = int(port) + rank
        if new_port > 65535:
            raise ConfigError(
                f"invalid kv_events_config.endpoint={endpoint!r}: data-parallel rank {rank} "
                f"would publish on port {new_port}"
            )
        return f"{base}:{new_port}"
    return f"{endpoint}_dp{rank}"


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard (`*` or `::`), ipc or inproc endpoint is bound; any other is
    connected to (the consumer binds it, as llm-d's indexer does). Mocker's `bind+` prefix
    binds any endpoint."""
    return (
        endpoint.startswith(BIND_PREFIX)
        or "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


def connectable(endpoint: str, host: str) -> str:
    """A bound endpoint as another machine dials it: a wildcard tcp host becomes `host`."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    address, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if address in _WILDCARD_HOSTS:
        address = f"[{host}]" if ":" in host else host
    return f"tcp://{address}:{port}"


def advertised_host(bind_host: str) -> str:
    """The address other machines reach this server at: $POD_IP (Kubernetes downward API),
    else the bound address, else (bound to every interface) this host's primary address."""
    pod_ip = os.environ.get("POD_IP", "").strip()
    if pod_ip:
        return pod_ip
    if bind_host not in _WILDCARD_HOSTS:
        return bind_host
    try:
        # No packet is sent: connecting a UDP socket only picks the outgoing interface.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


INT_HASHES_ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"


def int_block_hashes(environ: Mapping[str, str]) -> bool:
    """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (read as vLLM's `bool(int(value))`, default
    1): events name blocks by their hash's low 64 bits; 0: by the full digest."""
    raw = environ.get(INT_HASHES_ENV, "1")
    try:
        return bool(int(raw))
    except ValueError:
        raise ConfigError(
            f"invalid {INT_HASHES_ENV}={raw!r}: must be an integer (1: block hashes as 64-bit "
            "ints, vLLM's default; 0: as the full hash bytes)"
        ) from None
