"""Channels between tiers: the compiled channel (mocker/tiers/_clink.c) against the Python one
over a Link (the reference), verb for verb and bit for bit, and the callbacks' rules on both."""

from __future__ import annotations

import gc
import math
import random
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from mocker.tiers.channel import (
    Channel,
    TransferChannel,
    earliest,
    finish_due,
    finish_due_of,
    open_channel,
)
from mocker.tiers.link import Link, TransferId

if TYPE_CHECKING:
    from mocker.tiers import _clink as clink
else:
    clink = pytest.importorskip("mocker.tiers._clink", reason="built without a C compiler")

GB = 1e9
MB = 1_000_000


def both(bandwidth: float, latency: float = 0.0) -> tuple[Channel, clink.Channel]:
    link = Link(bandwidth, latency)
    return Channel(link, "cpu", "gpu"), clink.Channel(bandwidth, latency, "cpu", "gpu")


def recorder(log: list[tuple[int, float]], tid: list[TransferId]) -> Callable[[float], None]:
    def done(end: float) -> None:
        log.append((tid[0], end))

    return done


@pytest.mark.parametrize("seed", range(24))
def test_random_verbs_give_the_same_answers_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    bandwidth = rng.choice([0.0, 1 * GB, 3.7 * GB, 25 * GB]) if seed % 6 else 0.0
    latency = rng.choice([0.0, 1e-4, 2.5e-3])
    tick = MB / (bandwidth or GB)  # a MB's time alone: many transfers overlap
    py, c = both(bandwidth, latency)
    logs: tuple[list[tuple[int, float]], list[tuple[int, float]]] = ([], [])
    live: list[TransferId] = []
    now = 0.0
    for _ in range(400):
        verb = rng.random()
        # Mostly forward, sometimes a time the link has passed (it never goes back).
        step = rng.choice([0.0, rng.uniform(0, tick), rng.uniform(0, tick / 100), -tick / 10])
        now = max(0.0, now + step)
        if verb < 0.4:
            nbytes = rng.choice([0, MB, 2 * MB, rng.randrange(1, 64 * MB)])
            tids = []
            pair: tuple[TransferChannel, TransferChannel] = (py, c)
            for channel, log in zip(pair, logs, strict=True):
                box = [TransferId(0)]
                box[0] = channel.start(now, nbytes, recorder(log, box))
                tids.append(box[0])
            assert tids[0] == tids[1]
            live.append(tids[0])
        elif verb < 0.5 and live:
            tid = rng.choice(live)
            py.cancel(now, tid)
            c.cancel(now, tid)
        elif verb < 0.8:
            assert py.finish(now) == c.finish(now)
        else:
            deadline = py.next_deadline()
            assert deadline == c.next_deadline()
            if deadline is not None and rng.random() < 0.7:
                now = max(now, deadline)
                assert py.finish(now) == c.finish(now)
        assert len(py) == len(c)
        assert logs[0] == logs[1]  # the same transfers called back at the same times
    while (deadline := py.next_deadline()) is not None:
        assert deadline == c.next_deadline()
        assert py.finish(deadline) == c.finish(deadline) > 0
    assert c.next_deadline() is None and len(c) == 0
    assert logs[0] == logs[1]


def test_processor_sharing_figures() -> None:
    """1 GB/s: 1 MB alone takes 1 ms; a second 1 MB from 0.5 ms: done at 1.5 and 2 ms."""
    _, c = both(1 * GB, 1e-4)
    ends: list[float] = []
    c.start(0.0, MB, ends.append)
    assert c.next_deadline() == pytest.approx(1.1e-3)
    c.start(0.5e-3, MB, ends.append)
    assert c.next_deadline() == pytest.approx(1.6e-3)
    assert c.finish(1.6e-3) == 1
    assert c.finish(2.1e-3) == 1
    assert ends == [pytest.approx(1.6e-3), pytest.approx(2.1e-3)]
    assert c.duration(2 * MB) == pytest.approx(2.1e-3)
    assert c.key == ("cpu", "gpu") and not c.instant


@pytest.mark.parametrize("compiled", [False, True])
def test_callbacks_may_start_and_cancel_transfers(compiled: bool) -> None:
    """A callback runs once the link is at `now`: what it starts shares the link from its
    end; a transfer that ended by `now` is called back even if an earlier callback cancels
    it; one that had not ended is not."""
    channel = open_channel(Link(1 * GB), "cpu", "fs", compiled=compiled)
    ended: list[str] = []
    tids: dict[str, TransferId] = {}

    def first(end: float) -> None:
        ended.append("a")
        channel.cancel(end, tids["b"])  # ended too: still called back
        channel.cancel(end, tids["c"])  # not ended: never called back
        tids["d"] = channel.start(end, MB, lambda t: ended.append(f"d@{t * 1e3:.3f}"))

    tids["a"] = channel.start(0.0, MB, first)
    tids["b"] = channel.start(0.0, MB, lambda t: ended.append("b"))
    tids["c"] = channel.start(0.0, 4 * MB, lambda t: ended.append("c"))
    assert channel.finish(3e-3) == 2  # a and b: 1 MB each at a third of 1 GB/s
    assert ended == ["a", "b"]
    assert len(channel) == 1  # d
    while (deadline := channel.next_deadline()) is not None:
        channel.finish(deadline)
    assert ended == ["a", "b", "d@4.000"]  # d alone from 3 ms


@pytest.mark.parametrize("compiled", [False, True])
def test_a_callback_that_raises_stops_the_rest_and_leaves_the_channel_whole(
    compiled: bool,
) -> None:
    channel = open_channel(Link(1 * GB), "cpu", "fs", compiled=compiled)
    ended: list[float] = []

    def boom(end: float) -> None:
        raise RuntimeError("boom")

    channel.start(0.0, MB, boom)
    channel.start(0.0, MB, ended.append)
    channel.start(0.0, 8 * MB, ended.append)
    with pytest.raises(RuntimeError, match="boom"):
        channel.finish(3e-3)
    assert ended == [] and len(channel) == 1  # the second is lost with the first
    channel.start(3e-3, MB, ended.append)
    while (deadline := channel.next_deadline()) is not None:
        channel.finish(deadline)
    assert len(ended) == 2 and len(channel) == 0


def test_a_cycle_through_a_callback_is_collected() -> None:
    """The callbacks hold the engine that holds the channel: the collector frees both."""

    class Owner:
        def __init__(self) -> None:
            self.channel = clink.Channel(1 * GB, 0.0, "gpu", "cpu")
            self.channel.start(0.0, MB, self.done)

        def done(self, end: float) -> None:
            pass

    owner = Owner()
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="latency must be >= 0"):
        clink.Channel(1 * GB, -1.0, "cpu", "fs")
    with pytest.raises(ValueError, match=r"latency must be >= 0, got -1\.0"):
        clink.Channel(1 * GB, latency=-1.0, src="cpu", dst="fs")  # (by keyword: not in args)
    c = clink.Channel(0.0, 0.0, "cpu", "fs")
    assert c.instant
    with pytest.raises(TypeError):
        c.start(0.0, MB)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        c.start("now", MB, print)  # type: ignore[arg-type]
    assert len(c) == 0  # nothing half-started
    tid = c.start(0.0, MB, print)
    c.cancel(0.0, TransferId(tid + 1))  # no such transfer: nothing happens
    assert len(c) == 1


def test_open_channel_follows_the_pool_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCKER_COMPILED", "0")
    assert isinstance(open_channel(Link(GB), "cpu", "fs"), Channel)
    monkeypatch.setenv("MOCKER_COMPILED", "auto")
    assert isinstance(open_channel(Link(GB), "cpu", "fs"), clink.Channel)
    assert isinstance(open_channel(Link(GB), "cpu", "fs", compiled=False), Channel)


def test_earliest_matches_the_reference_over_mixed_channels() -> None:
    """The first channel with the earliest deadline wins; idle ones are skipped; Python
    channels are asked, compiled ones read."""
    rng = random.Random(7)
    for _ in range(200):
        channels: list[TransferChannel] = []
        for _ in range(rng.randrange(0, 6)):
            bandwidth = rng.choice([1 * GB, 2 * GB])
            channel = open_channel(Link(bandwidth), "cpu", "fs", compiled=rng.random() < 0.5)
            for _ in range(rng.randrange(0, 3)):
                channel.start(0.0, rng.choice([MB, 2 * MB]), print)
            channels.append(channel)
        want = earliest(channels)
        got = clink.earliest(channels)
        assert got[0] == want[0] and got[1] is want[1]
    assert clink.earliest([]) == (math.inf, None)
    with pytest.raises(TypeError):
        clink.earliest(tuple(channels))  # type: ignore[arg-type]


def test_earliest_survives_a_channel_that_changes_the_list() -> None:
    channels: list[TransferChannel] = []

    class Shrinking(Channel):
        def next_deadline(self) -> float | None:
            channels.clear()  # drops the compiled channel found first
            return 5.0

    first = clink.Channel(1 * GB, 0.0, "cpu", "fs")
    first.start(0.0, MB, print)
    channels += [first, Shrinking(Link(GB), "cpu", "obj")]
    del first
    t, which = clink.earliest(channels)
    assert t == pytest.approx(1e-3) and isinstance(which, clink.Channel)
    assert which.key == ("cpu", "fs")


def _world(
    compiled: bool, seed: int
) -> tuple[list[TransferChannel], list[tuple[str, int, float]], Callable[[float], float]]:
    """Four channels (one instant) whose callbacks log and sometimes start a transfer on
    another channel at their end; a compiled world runs the C loop, the other the reference."""
    rng = random.Random(seed)
    specs = [(1 * GB, 0.0), (2.5 * GB, 1e-4), (0.0, 0.0), (0.7 * GB, 2e-3)]
    channels = [open_channel(Link(b, lat), "cpu", f"t{i}", compiled=compiled)
                for i, (b, lat) in enumerate(specs)]  # fmt: skip
    log: list[tuple[str, int, float]] = []
    count = [0]

    def start(channel: TransferChannel, now: float, depth: int) -> None:
        count[0] += 1
        n = count[0]

        def done(end: float) -> None:
            log.append((channel.key[1], n, end))
            if depth < 3 and rng.random() < 0.5:  # a cascade, maybe on an instant link
                start(channels[rng.randrange(4)], end, depth + 1)

        channel.start(now, rng.choice([MB, 3 * MB, rng.randrange(1, 8 * MB)]), done)

    now = 0.0

    def run(bound: float) -> float:
        nonlocal now
        for _ in range(rng.randrange(0, 4)):
            start(channels[rng.randrange(4)], now, 0)
        now = bound
        return finish_due_of(compiled)(channels, bound)

    return channels, log, run


@pytest.mark.parametrize("seed", range(12))
def test_finish_due_matches_the_reference_in_order_and_count(seed: int) -> None:
    """Every transfer that ends by the bound is called back in time order, also those a
    callback starts that end by it (on any channel, an instant one too); the rest wait."""
    worlds = [_world(compiled, seed) for compiled in (False, True)]
    bound = 0.0
    steps = random.Random(seed + 100)
    for _ in range(60):
        bound += steps.choice([0.0, 1e-4, 1e-3, 5e-3])
        nexts = [run(bound) for _, _, run in worlds]
        assert nexts[0] == nexts[1]  # the next deadline, bit for bit
        (py_channels, py_log, _), (c_channels, c_log, _) = worlds
        assert c_log == py_log  # the same ends, bit for bit, in the same order
        assert [len(c) for c in c_channels] == [len(c) for c in py_channels]
        assert nexts[1] == earliest(c_channels)[0] and nexts[1] > bound
    assert len(worlds[1][1]) > 30  # (the sequences did run transfers)


def test_finish_due_asks_python_channels_too_and_stops_at_a_raise() -> None:
    py = Channel(Link(GB), "cpu", "fs")
    c = clink.Channel(2 * GB, 0.0, "cpu", "obj")
    ended: list[float] = []
    py.start(0.0, MB, ended.append)  # ends at 1 ms
    c.start(0.0, MB, ended.append)  # ends at 0.5 ms

    def boom(end: float) -> None:
        raise RuntimeError("a callback failed")

    c.start(0.0, 4 * MB, boom)  # ends at 2.5 ms: after both (sharing), raises
    py.start(0.0, 10 * MB, ended.append)
    with pytest.raises(RuntimeError, match="a callback failed"):
        clink.finish_due([py, c], 1.0)
    assert len(ended) == 2 and ended == sorted(ended)
    assert clink.finish_due([py, c], 1.0) == math.inf  # the rest: then all are idle
    assert len(ended) == 3 and len(py) == 0 and len(c) == 0
    assert clink.finish_due([], 1.0) == math.inf and finish_due([], 1.0) == math.inf
    with pytest.raises(TypeError):
        clink.finish_due((py, c), 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        clink.finish_due([py, c], "soon")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        clink.finish_due([py, c])  # type: ignore[call-arg]
