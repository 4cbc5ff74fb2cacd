"""Points on local worker processes: outcomes filed, a killed worker's point retried once,
then reported failed; a rerun skips what is filed."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from mocker.replay.trace import load_trace
from mocker.sweep.grid import Point, points
from mocker.sweep.local import run_local, worker_loop
from mocker.sweep.point import Outcome, execute_point
from mocker.sweep.spec import load_spec
from mocker.sweep.store import PointStore
from tests.sweep.dying import die_always_on_eight, die_first_time
from tests.sweep.specs import write_spec


def _run(
    tmp_path: Path, target: Callable[..., Any] = worker_loop
) -> tuple[list[Point], dict[str, Outcome], PointStore]:
    grid = points(load_spec(write_spec(tmp_path)))
    loaded = load_trace(tmp_path / "trace.jsonl", trace_block_size=64)[0]
    store = PointStore(tmp_path / "out")
    done: dict[str, Outcome] = {}

    def on_done(point: Point, outcome: Outcome) -> None:
        assert point.key not in done  # each point reported once
        done[point.key] = outcome

    run_local(grid, loaded, store, 2, on_done, target)
    return grid, done, store


def test_each_point_is_replayed_and_filed(tmp_path: Path) -> None:
    grid, done, store = _run(tmp_path)
    assert set(done) == {p.key for p in grid}
    loaded = load_trace(tmp_path / "trace.jsonl", trace_block_size=64)[0]
    for point in grid:
        assert done[point.key] == store.load(point.key)
        # The worker's outcome is the replay's own, run here in this process.
        assert done[point.key] == execute_point(point.argv, loaded)
    assert not list(store.dir.glob("*.log"))  # nothing printed: no logs left


def test_a_killed_worker_point_runs_again(tmp_path: Path) -> None:
    grid, done, store = _run(tmp_path, target=partial(worker_loop, run_one=die_first_time))
    assert all("summary" in done[p.key] for p in grid)
    assert len(list(store.dir.glob("*.died"))) == len(grid)  # each died once


def test_a_point_killed_twice_is_reported_failed(tmp_path: Path) -> None:
    grid, done, _ = _run(tmp_path, target=partial(worker_loop, run_one=die_always_on_eight))
    failed = [p for p in grid if "error" in done[p.key]]
    assert [p.values["max-num-seqs"] for p in failed] == [8, 8]
    assert all("its worker died 2 times" in done[p.key]["error"] for p in failed)
    assert sum("summary" in o for o in done.values()) == 2
