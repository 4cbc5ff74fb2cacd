"""KVHolds: held requests by id, released once, expired in deadline order."""

from __future__ import annotations

from mocker.disagg.holds import KVHolds
from tests.support.engines import core_request


def test_release_once_then_unknown() -> None:
    holds = KVHolds(timeout_s=10.0)
    a = core_request("a", [1, 2, 3])
    hold_id = holds.hold(a, 1.0)
    assert holds.next_deadline() == 11.0
    assert hold_id in holds and len(holds) == 1 and holds.hold_id_of("a") == hold_id
    assert holds.release(hold_id) is a
    assert holds.release(hold_id) is None
    assert holds.next_deadline() is None and not holds and holds.hold_id_of("a") is None


def test_a_reused_request_id_gets_a_hold_of_its_own() -> None:
    holds = KVHolds(timeout_s=10.0)
    first, second = (core_request("a", [1, 2, 3]) for _ in range(2))
    one, two = holds.hold(first, 0.0), holds.hold(second, 1.0)
    assert one != two and len(holds) == 2 and holds.hold_id_of("a") == two
    assert holds.release(one) is first and holds.hold_id_of("a") == two
    assert holds.expire(11.0) == [second] and not holds


def test_expiry_in_deadline_order_and_counted() -> None:
    holds = KVHolds(timeout_s=5.0)
    a, b, c = (core_request(rid, [1, 2, 3]) for rid in "abc")
    holds.hold(a, 0.0)
    b_id = holds.hold(b, 1.0)
    holds.hold(c, 2.0)
    holds.release(b_id)
    assert holds.next_deadline() == 5.0
    assert holds.expire(4.9) == []
    assert holds.expire(7.0) == [a, c]
    assert holds.num_expired == 2 and not holds
    assert holds.next_deadline() is None


def test_version_moves_when_the_set_changes() -> None:
    holds = KVHolds(timeout_s=1.0)
    v0 = holds.version
    holds.hold(core_request("a", [1, 2, 3]), 0.0)
    v1 = holds.version
    holds.expire(0.5)
    assert holds.version == v1 > v0
    holds.expire(1.0)
    assert holds.version > v1


def test_extend_moves_the_deadline_and_inf_claims_it() -> None:
    holds = KVHolds(timeout_s=5.0)
    a, b = (core_request(rid, [1, 2, 3]) for rid in "ab")
    a_id, b_id = holds.hold(a, 0.0), holds.hold(b, 0.0)
    assert holds.extend(a_id, 8.0) and not holds.extend("nobody", 8.0)
    assert holds.extend(a_id, 2.0)  # still held, and never shortened:
    assert holds.extend(b_id, float("inf"))
    assert holds.expire(7.0) == [] and holds.next_deadline() == 8.0
    assert holds.expire(8.0) == [a]
    assert holds.next_deadline() is None and holds.expire(1e9) == [] and b_id in holds
