"""Processor-sharing link: exact cases (1 GB/s, 1 MB transfers: alone 1 ms; two together 2 ms;
started at 0 and 0.5 ms, done at 1.5 and 2 ms), latency, cancellation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.tiers.link import Link

GB = 1e9  # bytes per second in one GB/s
MB = 1_000_000


def drain(link: Link) -> dict[int, float]:
    """Run the link to completion by jumping deadline to deadline, as the drivers do."""
    finished: dict[int, float] = {}
    while (deadline := link.next_deadline()) is not None:
        for tid, t in link.advance_to(deadline):
            finished[tid] = t
    return finished


def test_one_transfer_alone_takes_bytes_over_bandwidth() -> None:
    link = Link(1 * GB)
    a = link.start(0.0, MB)
    assert link.next_deadline() == pytest.approx(1e-3)
    assert drain(link) == {a: pytest.approx(1e-3)}


def test_two_started_together_share_the_link_and_both_end_at_2ms() -> None:
    link = Link(1 * GB)
    a = link.start(0.0, MB)
    b = link.start(0.0, MB)
    done = drain(link)
    assert done == {a: pytest.approx(2e-3), b: pytest.approx(2e-3)}


def test_a_later_arrival_slows_the_first() -> None:
    link = Link(1 * GB)
    a = link.start(0.0, MB)
    assert link.next_deadline() == pytest.approx(1e-3)
    b = link.start(0.5e-3, MB)
    # From 0.5 ms both run at 0.5 GB/s: a's remaining 0.5 MB takes 1 ms more.
    assert link.next_deadline() == pytest.approx(1.5e-3)
    done = drain(link)
    assert done[a] == pytest.approx(1.5e-3)
    assert done[b] == pytest.approx(2.0e-3)


@pytest.mark.parametrize("bandwidth", [0.0, -5.0])
def test_bandwidth_at_or_below_zero_is_instant(bandwidth: float) -> None:
    link = Link(bandwidth)
    a = link.start(0.25, 10 * MB)
    assert link.next_deadline() == 0.25
    assert link.advance_to(0.25) == [(a, 0.25)]
    assert len(link) == 0


def test_advance_to_returns_only_what_finished_by_then() -> None:
    link = Link(1 * GB)
    a = link.start(0.0, MB)
    b = link.start(0.0, 3 * MB)
    assert link.advance_to(1e-3) == []  # both at 0.5 GB/s: a is half done
    [(tid, t)] = link.advance_to(2.5e-3)
    assert tid == a and t == pytest.approx(2e-3)
    # b had 2 MB left at 2 ms; alone it takes 2 ms more.
    assert link.next_deadline() == pytest.approx(4e-3)
    assert drain(link) == {b: pytest.approx(4e-3)}


def test_latency_is_added_after_the_bytes() -> None:
    link = Link(1 * GB, latency_s=0.01)
    a = link.start(0.0, MB)
    b = link.start(0.0, MB)
    assert link.next_deadline() == pytest.approx(0.012)
    assert drain(link) == {a: pytest.approx(0.012), b: pytest.approx(0.012)}


def test_cancel_speeds_up_the_others() -> None:
    link = Link(1 * GB)
    a = link.start(0.0, MB)
    b = link.start(0.0, MB)
    assert link.cancel(1e-3, b)  # each got 0.5 MB by then
    assert drain(link) == {a: pytest.approx(1.5e-3)}
    assert not link.cancel(2e-3, a)  # already finished


def test_time_never_goes_back() -> None:
    link = Link(1 * GB)
    link.advance_to(1.0)
    a = link.start(0.5, MB)  # treated as starting at 1.0
    assert link.next_deadline() == pytest.approx(1.001)
    assert link.advance_to(0.9) == []
    assert drain(link) == {a: pytest.approx(1.001)}


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50 * MB), min_size=1, max_size=12),
    gaps=st.lists(st.floats(0.0, 5e-3), min_size=12, max_size=12),
)
def test_work_conservation_and_order(sizes: list[int], gaps: list[float]) -> None:
    """A busy processor-sharing link moves bytes at exactly its bandwidth: when every
    transfer starts before the link ever idles, the last one ends at start + total/B; and
    of transfers started together, smaller ones never end later."""
    link = Link(2 * GB)
    ids = [link.start(0.0, n) for n in sizes]
    done = drain(link)
    assert max(done.values()) == pytest.approx(sum(sizes) / (2 * GB), rel=1e-9)
    by_size = sorted(zip(sizes, ids, strict=True))
    ends = [done[tid] for _, tid in by_size]
    assert ends == sorted(ends)
    # Staggered starts: finish times never precede start + size/B.
    link = Link(2 * GB)
    t = 0.0
    starts = {}
    done.clear()
    for n, gap in zip(sizes, gaps, strict=False):
        t += gap
        done.update(dict(link.advance_to(t)))
        starts[link.start(t, n)] = (t, n)
    while (deadline := link.next_deadline()) is not None:
        done.update(dict(link.advance_to(deadline)))
    assert set(done) == set(starts)
    for tid, (start, n) in starts.items():
        assert done[tid] >= start + n / (2 * GB) - 1e-12
