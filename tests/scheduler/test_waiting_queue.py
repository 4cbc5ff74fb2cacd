"""Waiting queue: FCFS, priority order, preempted requests in front, lazy removal."""

import pytest

from mocker.scheduler.waiting_queue import WaitingQueue
from tests.support.engines import core_request


def test_fcfs_and_push_front_like_a_deque() -> None:
    q = WaitingQueue()
    a, b, c, d = (core_request(x, [1]) for x in "abcd")
    q.push(a)
    q.push(b)
    q.push_front(c)
    q.push_front(d)  # the latest preempted request goes first, as deque.appendleft
    assert [r.request_id for r in q] == ["d", "c", "a", "b"]
    assert q.pop() is d and q.peek() is c and len(q) == 3


def test_priority_orders_first_then_arrival() -> None:
    q = WaitingQueue()
    low = core_request("low", [1], priority=5)
    high1, high2 = core_request("high1", [1], priority=-1), core_request("high2", [1], priority=-1)
    for r in (low, high1, high2):
        q.push(r)
    assert [q.pop().request_id for _ in range(3)] == ["high1", "high2", "low"]


def test_remove_is_lazy_and_exact() -> None:
    q = WaitingQueue()
    a, b = core_request("a", [1]), core_request("b", [1])
    q.push(a)
    q.push(b)
    assert q.remove(a) and not q.remove(a)
    assert a not in q and len(q) == 1
    assert q.peek() is b
    q.push(a)  # re-adding after removal works
    assert [r.request_id for r in q] == ["b", "a"]
    with pytest.raises(ValueError, match="already waiting"):
        q.push(a)


def test_by_arrival_a_request_pushed_to_the_front_takes_its_arrivals_place() -> None:
    """vLLM's priority queue: (priority, arrival time); a preempted request goes back where
    its arrival puts it, not in front (ties: the order they came in)."""
    q = WaitingQueue(by_arrival=True)
    early, late, tie, urgent = (
        core_request(n, [1], arrival=t, priority=p)
        for n, t, p in (("early", 1.0, 0), ("late", 3.0, 0), ("tie", 1.0, 0), ("urgent", 9.0, -1))
    )
    q.push(late)
    q.push(early)
    q.push_front(tie)  # arrived with "early", came in after it
    q.push(urgent)
    assert [r.request_id for r in q] == ["urgent", "early", "tie", "late"]
