"""The ZMQ publisher over real sockets: framing, gap-free sequence, replay, bind/connect, ranks."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from mocker.config import ConfigError
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from mocker.kv.hashing import BlockHash
from mocker.kvevents.config import EventFormat, KVEventsConfig, connectable
from mocker.kvevents.publisher import ZmqEventPublisher
from tests.support.hashes import hash_tuple
from tests.support.kv_consumer import Subscriber, replay

LOOPBACK_ANY = "tcp://127.0.0.1:*"  # a port the system picks at bind time

STORED = BlockStored(
    block_hashes=hash_tuple(2**63 + 5, 11),
    parent_block_hash=BlockHash(2**64 - 2),
    token_ids=(10, 11, 12, 13),
    block_size=2,
    lora_name="adapter",
)
REMOVED = BlockRemoved(block_hashes=hash_tuple(11), medium="CPU")


@pytest.fixture
def publishers() -> Iterator[list[ZmqEventPublisher]]:
    made: list[ZmqEventPublisher] = []
    yield made
    for publisher in made:
        publisher.close()


@pytest.mark.parametrize("fmt", list(EventFormat))
def test_connect_mode_frames_every_field(
    fmt: EventFormat, publishers: list[ZmqEventPublisher]
) -> None:
    # llm-d's layout: the indexer binds, the engine connects (no wildcard in the endpoint).
    sub = Subscriber(LOOPBACK_ANY, bind=True, array_like=fmt is EventFormat.ARRAY)
    try:
        config = KVEventsConfig(enable_kv_cache_events=True, endpoint=sub.endpoint)
        publisher = ZmqEventPublisher(config, topic="kv@10.0.0.1:8000@m", fmt=fmt)
        publishers.append(publisher)
        assert not publisher.binds
        seq = publisher.publish([STORED, REMOVED], ts=1234.5)
        got = sub.wait_for_seq(seq)
        # The start-up batch waited for the subscription instead of being dropped.
        assert [m.seq for m in got] == [0, 1]
        assert [type(e).__name__ for e in got[0].batch.events] == ["AllBlocksCleared"]
        last = got[-1]
        assert last.topic == b"kv@10.0.0.1:8000@m"
        assert last.batch.ts == 1234.5 and last.batch.data_parallel_rank == 0
        stored, removed = last.batch.events
        assert type(stored).__name__ == "BlockStored"
        assert stored.block_hashes == [2**63 + 5, 11]
        assert stored.parent_block_hash == 2**64 - 2
        assert stored.token_ids == [10, 11, 12, 13] and stored.block_size == 2
        assert stored.lora_id is None and stored.medium == "GPU"
        assert stored.lora_name == "adapter" and stored.extra_keys is None
        assert type(removed).__name__ == "BlockRemoved"
        assert removed.block_hashes == [11] and removed.medium == "CPU"
    finally:
        sub.close()


def test_bind_mode_and_data_parallel_rank(
    tmp_path: Path, publishers: list[ZmqEventPublisher]
) -> None:
    base = f"ipc://{tmp_path}/kv"
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=base)
    publisher = ZmqEventPublisher(config, rank=2)
    publishers.append(publisher)
    assert publisher.binds and publisher.endpoint == base + "_dp2"
    sub = Subscriber(publisher.endpoint)
    try:
        seq = publisher.publish([REMOVED])
        got = sub.wait_for_seq(seq)
        assert [m.seq for m in got] == [0, 1]  # the start-up batch waited for us
        batch = got[-1].batch
        assert batch.data_parallel_rank == 2 and batch.events[0].block_hashes == [11]
    finally:
        sub.close()


def test_tcp_rank_offsets_the_port(publishers: list[ZmqEventPublisher]) -> None:
    sub = Subscriber(LOOPBACK_ANY, bind=True)
    port = int(sub.endpoint.rpartition(":")[2])
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{port - 1}")
    try:  # rank 1 dials port + 1: the subscriber's
        publisher = ZmqEventPublisher(config, rank=1)
        publishers.append(publisher)
        assert sub.wait_for_seq(0)[0].batch.data_parallel_rank == 1
    finally:
        sub.close()


def test_replay_serves_the_buffer_with_end_marker(publishers: list[ZmqEventPublisher]) -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=LOOPBACK_ANY,  # nobody subscribes: replay still works
        replay_endpoint=LOOPBACK_ANY,
        buffer_steps=6,
    )
    publisher = ZmqEventPublisher(config, topic="t", first_subscriber_wait_s=0.05)
    publishers.append(publisher)
    url = publisher.replay_endpoint
    assert url is not None
    deadline = time.monotonic() + 10
    while not (first := replay(url, 0)):  # sent once nobody subscribed within the wait
        assert time.monotonic() < deadline
    assert [m.seq for m in first] == [0]
    assert [type(e).__name__ for e in first[0].batch.events] == ["AllBlocksCleared"]
    assert first[0].topic == b"t"
    for i in range(9):
        publisher.publish([BlockRemoved(block_hashes=hash_tuple(i))])
    deadline = time.monotonic() + 10
    while [m.seq for m in replay(url, 0)] != [4, 5, 6, 7, 8, 9]:  # the last buffer_steps
        assert time.monotonic() < deadline
    later = replay(url, 8)
    assert [m.seq for m in later] == [8, 9]
    assert later[0].batch.events[0].block_hashes == [7]
    assert replay(url, 100) == []  # nothing that new: just the end marker


def test_replays_run_beside_live_publishing(publishers: list[ZmqEventPublisher]) -> None:
    sub = Subscriber(LOOPBACK_ANY, bind=True)
    config = KVEventsConfig(
        endpoint=sub.endpoint,
        replay_endpoint=LOOPBACK_ANY,
        buffer_steps=3000,
        max_queue_size=8,
    )
    try:
        publisher = ZmqEventPublisher(config)
        publishers.append(publisher)
        replay_url = publisher.replay_endpoint
        assert replay_url is not None
        for i in range(3000):
            publisher.publish([BlockRemoved(block_hashes=hash_tuple(i))])
        sub.wait_for_seq(3000)
        results: list[list[int]] = []

        def hammer() -> None:
            for _ in range(5):
                results.append([m.seq for m in replay(replay_url, 0)])

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        for i in range(600):  # a queue of 8 batches: replays must not hold the sender up
            last = publisher.publish([BlockRemoved(block_hashes=hash_tuple(i))])
        for t in threads:
            t.join(60)
        assert [m.seq for m in sub.wait_for_seq(last)] == list(range(last + 1))
        # Each replay is a contiguous run of the buffer, ending at or after 3000.
        assert len(results) == 15
        for seqs in results:
            assert len(seqs) == 3000 and seqs == list(range(seqs[0], seqs[0] + 3000))
    finally:
        sub.close()


def test_malformed_replay_request_still_gets_the_end_marker(
    publishers: list[ZmqEventPublisher],
) -> None:
    config = KVEventsConfig(replay_endpoint=LOOPBACK_ANY, endpoint="inproc://x")
    publisher = ZmqEventPublisher(config)
    publishers.append(publisher)
    assert publisher.replay_endpoint is not None
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        dealer.connect(publisher.replay_endpoint)
        dealer.send_multipart([b"", b"\x01\x02"])  # a start sequence must be 8 bytes
        assert dealer.recv_multipart() == [b"", b"", b"\xff" * 8, b""]
    finally:
        dealer.close(linger=0)
        ctx.term()


def test_full_queue_waits_instead_of_dropping(publishers: list[ZmqEventPublisher]) -> None:
    sub = Subscriber(LOOPBACK_ANY, bind=True)
    try:
        config = KVEventsConfig(endpoint=sub.endpoint, max_queue_size=1)
        publisher = ZmqEventPublisher(config)
        publishers.append(publisher)
        for i in range(300):  # most wait: the first batch holds the queue until we subscribe
            last = publisher.publish([BlockRemoved(block_hashes=hash_tuple(i))])
        assert [m.seq for m in sub.wait_for_seq(last)] == list(range(last + 1))
    finally:
        sub.close()


def test_a_stalled_subscriber_never_blocks_the_engine(publishers: list[ZmqEventPublisher]) -> None:
    # A subscriber that reads nothing: past the high-water mark ZMQ drops for it.
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(LOOPBACK_ANY)
    try:
        config = KVEventsConfig(endpoint=sub.getsockopt_string(zmq.LAST_ENDPOINT), hwm=4)
        publisher = ZmqEventPublisher(config, first_subscriber_wait_s=0.05)
        publishers.append(publisher)
        for i in range(20_000):
            publisher.publish([BlockRemoved(block_hashes=hash_tuple(i))])
        publisher.close(timeout=10)
        assert not publisher._sender.is_alive()  # drained and stopped ...
        assert publisher._buffer[-1][0] == 20_000  # ... having sent every batch
    finally:
        sub.close(linger=0)
        ctx.term()


def test_bind_failure_is_a_config_error_naming_the_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = KVEventsConfig(replay_endpoint=f"tcp://127.0.0.1:{port}", endpoint="inproc://y")
        with pytest.raises(ConfigError, match=r"kv_events_config\.replay_endpoint.*in use"):
            ZmqEventPublisher(config)


def test_close_during_the_first_subscriber_wait_is_prompt() -> None:
    # Nobody subscribes and the start-up wait is a minute: close must cut it short. (Bounds
    # far from both outcomes, so a loaded machine cannot blur them: a sender that sat out
    # the wait would hold close for its whole 30 s join timeout and still be alive.)
    config = KVEventsConfig(endpoint="inproc://w")
    publisher = ZmqEventPublisher(config, first_subscriber_wait_s=60.0)
    started = time.monotonic()
    publisher.close(timeout=30.0)
    assert time.monotonic() - started < 20.0
    assert not publisher._sender.is_alive()


def test_ipv6_endpoint_binds(publishers: list[ZmqEventPublisher]) -> None:
    config = KVEventsConfig(endpoint="tcp://[::1]:*")  # `::` (and `*`) in it: bound
    try:
        publisher = ZmqEventPublisher(config, first_subscriber_wait_s=0.0)
    except ConfigError as exc:
        pytest.skip(f"no IPv6 loopback on this machine: {exc}")
    publishers.append(publisher)
    assert publisher.binds
    assert re.fullmatch(r"tcp://\[::1\]:\d+", publisher.endpoint), publisher.endpoint


def test_wildcard_ports_bind_ports_the_system_picks_and_report_them(
    publishers: list[ZmqEventPublisher],
) -> None:
    # ZMQ's `*` port: the system picks a free port at bind time and the publisher names it.
    # Data-parallel ranks do not offset a wildcard: each binds a free port of its own.
    config = KVEventsConfig(endpoint=LOOPBACK_ANY, replay_endpoint="tcp://*:*")
    ranks = [ZmqEventPublisher(config, rank=r) for r in range(2)]
    publishers.extend(ranks)
    for publisher in ranks:
        assert publisher.binds
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", publisher.endpoint), publisher.endpoint
        assert re.fullmatch(r"tcp://\*:\d+", publisher.replay_endpoint or ""), publisher
    ports = {p.endpoint.rpartition(":")[2] for p in ranks}
    ports |= {(p.replay_endpoint or "").rpartition(":")[2] for p in ranks}
    assert len(ports) == 4  # four sockets, four ports
    for rank, publisher in enumerate(ranks):
        sub = Subscriber(publisher.endpoint)  # the reported endpoint is the real one
        try:
            seq = publisher.publish([BlockRemoved(block_hashes=hash_tuple(rank))])
            got = sub.wait_for_seq(seq)
            assert got[-1].batch.data_parallel_rank == rank
            assert got[-1].batch.events[0].block_hashes == [rank]
        finally:
            sub.close()
        replay_url = connectable(publisher.replay_endpoint or "", "127.0.0.1")
        assert [m.seq for m in replay(replay_url, 0)] == [0, 1]


def test_an_any_address_wildcard_port_is_bound_without_the_connect_warning(
    publishers: list[ZmqEventPublisher], caplog: pytest.LogCaptureFixture
) -> None:
    # `tcp://0.0.0.0:PORT` has no `*`, so by vLLM's rule it is connected to (and warned
    # about); `tcp://0.0.0.0:*` has one, and is bound.
    with caplog.at_level(logging.WARNING, logger="mocker.kvevents.publisher"):
        config = KVEventsConfig(endpoint="tcp://0.0.0.0:*")
        publisher = ZmqEventPublisher(config, first_subscriber_wait_s=0.0)
    publishers.append(publisher)
    assert publisher.binds
    assert re.fullmatch(r"tcp://0\.0\.0\.0:\d+", publisher.endpoint), publisher.endpoint
    assert "has no '*'" not in caplog.text


def test_publish_after_close_is_an_error() -> None:
    publisher = ZmqEventPublisher(KVEventsConfig(endpoint="inproc://z"))
    publisher.close()
    with pytest.raises(RuntimeError, match="closed"):
        publisher.publish([AllBlocksCleared()])


def test_bind_prefix_binds_one_address_and_reports_it_plain(
    publishers: list[ZmqEventPublisher],
) -> None:
    """`bind+tcp://127.0.0.1:PORT` binds that address (vLLM would connect to it); the endpoint
    reported to subscribers has no prefix. A port that another process takes between our
    probe and the bind is retried with a new one (never assumed to stay free)."""
    for _ in range(5):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = KVEventsConfig(
            enable_kv_cache_events=True, endpoint=f"bind+tcp://127.0.0.1:{port}"
        )
        try:
            publisher = ZmqEventPublisher(config)
        except ConfigError as exc:
            assert "cannot bind" in str(exc)
            continue
        publishers.append(publisher)
        break
    else:
        pytest.fail("no free loopback port in 5 tries")
    assert publisher.binds and publisher.endpoint == f"tcp://127.0.0.1:{port}"
    sub = Subscriber(publisher.endpoint)
    try:
        seq = publisher.publish([REMOVED])
        assert [m.seq for m in sub.wait_for_seq(seq)] == [0, 1]
    finally:
        sub.close()
