"""RemotePulls: processor-shared pulls, answers now or later, timeouts, cancels, records."""

from __future__ import annotations

import pytest

from mocker.disagg.params import RemotePrefill
from mocker.disagg.pulls import Pull, RemotePulls
from mocker.tiers.link import Link
from tests.support.engines import core_request

REMOTE = RemotePrefill("P", "p1", (0, 1), "localhost", 5600)


class Peers:
    """Answers as told; remembers what it was told."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.read: list[str] = []
        self.released: list[RemotePrefill] = []

    def read_done(self, pull: Pull) -> bool | None:
        self.read.append(pull.request.request_id)
        return self.answer

    def release(self, remote: RemotePrefill) -> None:
        self.released.append(remote)


def _pulls(answer: bool | None, timeout: float = 100.0) -> tuple[RemotePulls, Peers]:
    peers = Peers(answer)
    # 1000 bytes per second; a block is 100 bytes.
    return RemotePulls(Link(1000.0), block_bytes=100, timeout_s=timeout, peers=peers), peers


def test_two_pulls_share_the_link_and_land_in_order() -> None:
    pulls, peers = _pulls(True)
    a, b = (core_request(rid, [1] * 8, remote_prefill=REMOTE) for rid in "ab")
    pulls.start(0.0, a, 2)  # 200 bytes
    pulls.start(0.0, b, 4)  # 400 bytes
    # Both at 500 B/s until a is through at 0.4 s; b alone then: 200 bytes left, 0.2 s.
    first = pulls.next_deadline()
    assert first is not None and first == pytest.approx(0.4)
    assert pulls.poll(first) == ([a], [])
    second = pulls.next_deadline()
    assert second is not None and second == pytest.approx(0.6)
    assert pulls.poll(second) == ([b], [])
    assert peers.read == ["a", "b"] and not pulls
    records = pulls.take_records()
    assert [(r.request_id, r.ok, round(r.duration, 6)) for r in records] == [
        ("a", True, 0.4), ("b", True, 0.6),
    ]  # fmt: skip


def test_a_refused_read_fails_the_pull() -> None:
    pulls, _ = _pulls(False)
    a = core_request("a", [1] * 8, remote_prefill=REMOTE)
    pulls.start(0.0, a, 1)
    assert pulls.poll(1.0) == ([], [a])
    assert pulls.num_failed == 1


def test_a_later_answer_is_applied_by_the_next_poll() -> None:
    pulls, _ = _pulls(None)
    a = core_request("a", [1] * 8, remote_prefill=REMOTE)
    pulls.start(0.0, a, 1)
    assert pulls.poll(0.1) == ([], [])  # through, waiting for the answer
    assert pulls.next_deadline() == pytest.approx(100.0)  # only its timeout is left
    pulls.confirm("a", True)
    assert pulls.poll(0.2) == ([a], [])
    pulls.confirm("a", False)  # gone: ignored
    assert pulls.poll(0.3) == ([], [])


def test_timeout_cancels_the_transfer_and_releases_the_prefill() -> None:
    pulls, peers = _pulls(True, timeout=1.0)
    a = core_request("a", [1] * 8, remote_prefill=REMOTE)
    pulls.start(0.0, a, 100)  # 10 s of bytes
    assert pulls.next_deadline() == pytest.approx(1.0)
    assert pulls.poll(1.0) == ([], [a])
    assert peers.released == [REMOTE] and peers.read == []
    assert not pulls and pulls.next_deadline() is None
    (record,) = pulls.take_records()
    assert not record.ok and record.end == 1.0


def test_cancel_releases_and_frees_the_link() -> None:
    pulls, peers = _pulls(True)
    a, b = (core_request(rid, [1] * 8, remote_prefill=REMOTE) for rid in "ab")
    pulls.start(0.0, a, 2)
    pulls.start(0.0, b, 2)
    assert pulls.cancel(0.2, a)
    assert not pulls.cancel(0.2, a)
    assert peers.released == [REMOTE]
    # b got 100 bytes in 0.2 s at half the link; the other 100 alone take 0.1 s.
    assert pulls.next_deadline() == pytest.approx(0.3)
