"""Data-parallel engine group: vLLM's least-loaded score, rank pinning, one lifecycle."""

import asyncio
from typing import NoReturn

import pytest

from mocker.engine.group import EngineGroup, RankError
from mocker.engine.live import EngineDeadError, LiveEngine
from tests.support.engines import req, small_config


def group(k: int, **overrides: object) -> EngineGroup:
    config = small_config(**{"speedup_ratio": 100.0, **overrides})
    return EngineGroup([LiveEngine(config) for _ in range(k)])


async def test_waiting_counts_four_times_running() -> None:
    # A tenth of real time: the requests below run for about ten seconds, so all four are
    # still running when counted, however late a loaded machine starts the loops.
    g = group(3, speedup_ratio=0.1, num_gpu_blocks=512)
    # Engine loops are not started: requests stay waiting in the inbox, as a burst within
    # one pass would.
    g[0].add_request(req("a", [1] * 8, max_tokens=200))
    assert g.pick() is g[1]  # scores 4, 0, 0: the lowest rank of the least loaded
    g[1].add_request(req("b", [1] * 8, max_tokens=200))
    g[2].add_request(req("c", [1] * 8, max_tokens=200))
    g[2].add_request(req("d", [1] * 8, max_tokens=200))
    assert g.pick() is g[0]  # 4, 4, 8
    # Running requests weigh a quarter of waiting ones (vLLM: 4 × waiting + running).
    g.start()
    async with asyncio.timeout(5):
        while sum(e.num_running for e in g) < 4:
            await asyncio.sleep(0.001)
    assert [e.num_running for e in g] == [1, 1, 2]
    g[0].add_request(req("e", [1] * 8))  # rank 0: 1 running + 1 waiting = 5
    assert g.pick() is g[1]  # 5, 1, 2
    await g.stop()


async def test_an_idle_group_keeps_choosing_rank_zero() -> None:
    # As vLLM's front end: ties go to the lowest rank, so one-at-a-time traffic stays on the
    # warm prefix cache of rank 0 instead of being sprayed across ranks.
    g = group(2)
    g.start()
    for i in range(3):
        engine = g.pick()
        assert engine is g[0]
        async for _ in engine.generate(req(f"r{i}", [5] * 8, max_tokens=2)):
            pass
    await g.stop()


def test_a_burst_spreads_evenly() -> None:
    g = group(4)
    for i in range(40):
        g.pick().add_request(req(f"r{i}", [1] * 4))
    assert [e.num_waiting for e in g] == [10, 10, 10, 10]


def test_rank_pins_and_out_of_range_is_refused() -> None:
    g = group(2)
    g[1].add_request(req("busy", [1] * 4))
    assert g.pick(1) is g[1]  # pinned, though rank 0 is idle
    assert g.pick(0) is g[0]
    for rank in (2, -1):
        with pytest.raises(RankError, match=r"out of range \[0, 2\)"):
            g.pick(rank)


async def test_lifecycle_counts_and_aborts_span_every_rank() -> None:
    g = group(2)
    g.start()
    streams = [g[0].add_request(req("a", [1] * 8, max_tokens=50)),
               g[1].add_request(req("b", [1] * 8, max_tokens=50))]  # fmt: skip
    assert g.num_open_streams == 2
    assert g.abort_all() == 2
    for stream in streams:
        out = await stream.get()
        assert out.finished
    async with asyncio.timeout(5):
        while g.num_open_streams or any(e.core.pool.num_used for e in g):
            await asyncio.sleep(0.001)
    assert not g.is_dead and g.dead_error is None
    await g.stop()
    assert g.is_dead  # a stopped group refuses work, as one stopped engine does
    with pytest.raises(EngineDeadError):
        await g.reset_prefix_cache()


async def test_one_dead_rank_makes_the_group_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    g = group(2)
    g.start()

    def boom(now: float) -> NoReturn:
        raise RuntimeError("simulated engine bug")

    monkeypatch.setattr(g[1].core, "step", boom)
    stream = g[1].add_request(req("x", [1] * 4))
    with pytest.raises(EngineDeadError):
        await stream.get()
    assert g.is_dead and "simulated engine bug" in str(g.dead_error)
    await g.stop()


async def test_reset_prefix_cache_clears_every_rank() -> None:
    g = group(2, block_size=4)
    g.start()
    for i, engine in enumerate(g):
        async for _ in engine.generate(req(f"r{i}", [7 + i] * 12, max_tokens=1)):
            pass
    cached = [len(list(e.core.pool.cached_hashes())) for e in g]
    assert all(cached)
    assert await g.reset_prefix_cache() == (True, sum(cached))
    assert [len(list(e.core.pool.cached_hashes())) for e in g] == [0, 0]
    await g.stop()


async def test_a_whole_reset_is_refused_while_blocks_are_referenced() -> None:
    # vLLM 0.34's reset: all or nothing, refused while a request holds blocks; with
    # reset_running_requests its running requests are preempted first (they recompute).
    g = group(1, block_size=4, speedup_ratio=0.1)
    g.start()
    (engine,) = g
    async for _ in engine.generate(req("cached", [5] * 12, max_tokens=1)):
        pass
    stream = engine.add_request(req("running", [9] * 12, max_tokens=200))
    while not engine.core.scheduler.running:
        await asyncio.sleep(0.005)
    held = len(engine.core.pool.cached_hashes())
    assert await g.reset_prefix_cache(whole=True) == (False, 0)
    assert len(engine.core.pool.cached_hashes()) == held
    ok, cleared = await g.reset_prefix_cache(whole=True, reset_running=True)
    assert ok and cleared == held  # (the preempted request recomputes at once after)
    request = engine.core.requests["running"]
    assert request.num_preemptions == 1
    engine.abort("running", stream)
    await g.stop()


def test_a_group_needs_an_engine() -> None:
    with pytest.raises(ValueError, match="at least one"):
        EngineGroup([])
