"""The same spec gives the same table on a local Ray cluster as on the local processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from mocker.cli import main
from mocker.replay.trace import TraceRequest, load_trace
from mocker.sweep.grid import Point, points
from mocker.sweep.on_ray import run_on_ray
from mocker.sweep.point import Outcome
from mocker.sweep.spec import load_spec
from tests.sweep.dying import die_always_on_ray, die_first_time_on_ray
from tests.sweep.specs import write_spec

Task = Callable[[list[str], list[TraceRequest] | None], Outcome]

ray = pytest.importorskip("ray", reason="Ray is not installed: the Ray sweep is NOT tested")


def test_ray_and_the_local_processes_give_the_same_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(write_spec(tmp_path, axes={"num-engines": [1, 2], "max-num-seqs": [2, 8],
                                          "router": ["round-robin", "kv-aware"]}))  # fmt: skip
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", spec, "--output-dir", str(local), "--jobs", "2", "--no-plots"]) == 0
    argv = ["sweep", spec, "--output-dir", str(on_ray), "--no-plots", "--ray-address", "local",
            "--jobs", "2"]  # fmt: skip
    assert main(argv) == 0
    assert not ray.is_initialized()  # shut down after the sweep
    table = (local / "sweep.csv").read_text()
    assert table == (on_ray / "sweep.csv").read_text()
    assert table.count("\n") == 9
    # The driver filed Ray's results: a rerun on local processes runs nothing.
    capsys.readouterr()
    assert main(["sweep", spec, "--output-dir", str(on_ray), "--no-plots"]) == 0
    assert "0 to run" in capsys.readouterr().err


def test_an_unreachable_cluster_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", str(write_spec(tmp_path)), "--output-dir", str(tmp_path / "o"),
            "--ray-address", "127.0.0.1:1"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mocker: --ray-address 127.0.0.1:1: cannot join the cluster")


def _run_on_ray(tmp_path: Path, target: Task) -> dict[str, Outcome]:
    from ray import cloudpickle

    import tests.sweep.dying

    # The workers need not import the tests: the killing task travels by value.
    by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value
    by_value(tests.sweep.dying)
    grid = points(load_spec(write_spec(tmp_path)))
    loaded = load_trace(tmp_path / "trace.jsonl", trace_block_size=64)[0]
    done: dict[str, Outcome] = {}

    def on_done(point: Point, outcome: Outcome) -> None:
        assert point.key not in done
        done[point.key] = outcome

    try:
        run_on_ray(grid, loaded, "local", 2, on_done, target)
    finally:
        by_reference: Callable[[ModuleType], None] = cloudpickle.unregister_pickle_by_value
        by_reference(tests.sweep.dying)
    assert set(done) == {p.key for p in grid}
    return done


def test_a_killed_ray_worker_point_runs_again_then_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("SWEEP_TEST_MARKERS", str(markers))
    done = _run_on_ray(tmp_path, die_first_time_on_ray)
    assert all("summary" in o for o in done.values()) and len(list(markers.iterdir())) == 4
    done = _run_on_ray(tmp_path, die_always_on_ray)
    assert all(o["error"].startswith("its worker died twice") for o in done.values())
