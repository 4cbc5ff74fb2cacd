"""Pins on a tier's blocks: runs registered in O(1), counted per key once asked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.kv.hashing import BlockHash
from mocker.tiers.pins import Pins


def keys(*ks: int) -> list[BlockHash]:
    return [BlockHash(k) for k in ks]


def pinned(pins: Pins, key: int) -> bool:
    return BlockHash(key) in pins.counts()


def test_a_run_is_released_by_the_sequence_that_took_it_or_an_equal_one() -> None:
    pins = Pins()
    load = keys(1, 2, 3)
    pins.add(load)
    pins.add(load)  # the same sequence twice (two readers)
    assert pins.per_key() == {1: 2, 2: 2, 3: 2}
    pins.remove(load)
    pins.remove(keys(1, 2, 3))  # an equal sequence finds it too
    assert not pins and pins.per_key() == {}


def test_releasing_what_was_never_pinned_is_a_bug() -> None:
    pins = Pins("cpu")
    pins.add(keys(1, 2))
    with pytest.raises(ValueError, match="cpu block 1 unpinned more often than pinned"):
        pins.remove(keys(1))  # part of a run: a pin is released whole
    with pytest.raises(ValueError, match="unpinned more often"):
        pins.remove(keys(7))


def test_counts_built_on_demand_follow_later_pins_and_releases() -> None:
    pins = Pins()
    a, b = keys(1, 2), keys(2, 3)
    pins.add(a)
    assert pinned(pins, 1) and pinned(pins, 2) and not pinned(pins, 3)  # built now
    pins.add(b)  # kept up to date from here on
    pins.remove(a)
    assert not pinned(pins, 1) and pinned(pins, 2) and pinned(pins, 3)
    assert pins.per_key() == {2: 1, 3: 1}
    pins.remove(b)
    assert not pins and not pinned(pins, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=60), st.data())
def test_per_key_counts_match_a_recount_of_the_live_runs(
    ops: list[tuple[bool, int]], data: st.DataObject
) -> None:
    pins = Pins()
    runs = [keys(*range(i, i + 3)) for i in range(6)]  # overlapping runs
    live: list[list[BlockHash]] = []
    for add, i in ops:
        if add or not live:
            pins.add(runs[i])
            live.append(runs[i])
        else:
            run = live.pop(data.draw(st.integers(0, len(live) - 1)))
            pins.remove(run)
        if data.draw(st.booleans()):
            pins.counts()  # built at any moment, then kept up to date
        expected: dict[BlockHash, int] = {}
        for run in live:
            for k in run:
                expected[k] = expected.get(k, 0) + 1
        assert pins.per_key() == expected
        assert bool(pins) == bool(live)
