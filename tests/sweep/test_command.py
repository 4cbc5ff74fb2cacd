"""`mocker sweep` end to end: the table, the best point, resuming, exit codes, bad input."""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from mocker.cli import main
from mocker.sweep import command
from mocker.sweep.grid import Point
from mocker.sweep.point import execute_point
from tests.sweep.specs import TRACE_FLAGS, write_spec


def _rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))


def test_a_sweep_writes_its_table_plot_and_best_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sweep", str(write_spec(tmp_path)), "--output-dir", str(out), "--jobs", "2"]) == 0
    rows = _rows(out)
    assert [(r["num-engines"], r["max-num-seqs"]) for r in rows] == [
        ("1", "2"), ("1", "8"), ("2", "2"), ("2", "8")]  # fmt: skip
    assert all(r["status"] == "ok" and r["requests"] == "24" for r in rows)
    # The configurations differ where a planner looks: latency and cost.
    assert len({r["ttft_p90_s"] for r in rows}) > 1 and len({r["gpu_hours"] for r in rows}) > 1
    assert sum(r["best"] == "True" for r in rows) == 1
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr()
    assert "best: point" in printed.out and "4 to run" in printed.err
    chosen = next(r for r in rows if r["best"] == "True")
    assert f"best: point {chosen['point']} " in printed.out


def test_a_rerun_keeps_finished_points_and_runs_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    spec = write_spec(tmp_path)
    assert main(["sweep", str(spec), "--output-dir", str(out), "--no-plots"]) == 0
    first = (out / "sweep.csv").read_text()
    capsys.readouterr()
    assert main(["sweep", str(spec), "--output-dir", str(out), "--no-plots"]) == 0
    assert "4 kept or invalid, 0 to run" in capsys.readouterr().err
    assert (out / "sweep.csv").read_text() == first
    # One more value on an axis: only its points run.
    spec = write_spec(tmp_path, axes={"num-engines": [1, 2, 3], "max-num-seqs": [2, 8]})
    assert main(["sweep", str(spec), "--output-dir", str(out), "--no-plots"]) == 0
    assert "4 kept or invalid, 2 to run" in capsys.readouterr().err
    assert len(_rows(out)) == 6


def test_an_slo_no_point_meets_names_the_closest_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, slo={"ttft": 0.0001, "attainment": 1.0})
    assert main(["sweep", str(spec), "--output-dir", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "no point meets the SLO (100% of requests within ttft <= 0.0001 s)" in err
    assert "the closest is point" in err and "of requests within the bounds (100% needed)" in err


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"axes": {"bogus": [1, 2]}}, "mocker: axes: unknown flag --bogus"),
        ({"axes": {"num-engines": []}}, "mocker: axes: --num-engines must be a non-empty list"),
        ({"trace": "missing.jsonl"}, "mocker: trace: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], parts: dict[str, object], message: str
) -> None:
    spec = write_spec(tmp_path, **parts)
    assert main(["sweep", str(spec), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_bad_jobs_and_prices_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(write_spec(tmp_path))
    assert main(["sweep", spec, "--jobs", "0"]) == 2
    assert "invalid jobs=0" in capsys.readouterr().err
    priced = str(write_spec(tmp_path, **{"gpu-hour-price": {"b200_sxm": 5.0}}))
    assert main(["sweep", priced, "--output-dir", str(tmp_path / "o")]) == 2
    assert "gpu-hour-price: no price for h100_sxm" in capsys.readouterr().err


def test_a_synthetic_workload_sweeps_its_rate(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, trace=None, flags={"timing-model": "polynomial"},
                      synthetic={"num-requests": 30, "input-len": 200, "output-len": 8},
                      axes={"rate": [2, 50]})  # fmt: skip
    out = tmp_path / "o"
    assert main(["sweep", str(spec), "--output-dir", str(out), "--quiet", "--no-plots"]) in (0, 1)
    rows = _rows(out)
    assert [r["rate"] for r in rows] == ["2", "50"]
    assert float(rows[0]["sim_duration_s"]) > float(rows[1]["sim_duration_s"])


def test_ray_missing_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    argv = ["sweep", str(write_spec(tmp_path)), "--ray-address", "local"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "mocker: --ray-address: Ray is not installed here (pip install 'mocker[ray]')\n"
    )


def test_a_warning_every_point_shares_shows_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The polynomial times every GPU alike: each point's --gpu is named in a warning.
    spec = write_spec(tmp_path, axes={"num-engines": [1, 2], "max-num-seqs": [2, 8]},
                      flags={**TRACE_FLAGS, "gpu": "b200_sxm"})  # fmt: skip
    main(["sweep", str(spec), "--output-dir", str(tmp_path / "o"), "--no-plots"])
    assert capsys.readouterr().err.count("ignoring --gpu") == 1


@pytest.mark.parametrize("where", ["local", "ray"])
def test_an_interrupted_sweep_keeps_what_finished(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    def one_then_interrupt(todo: list[Point], loaded: object, *args: object) -> None:
        on_done: Callable[[Point, Any], None] = cast(Any, args[-1])  # both runners: last
        on_done(todo[0], execute_point(todo[0].argv, cast(Any, loaded)))
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_on_ray", one_then_interrupt)
    monkeypatch.setattr(command, "run_local", one_then_interrupt)
    monkeypatch.setattr(command, "check_address", lambda _: None)
    spec, out = str(write_spec(tmp_path)), str(tmp_path / "o")
    extra = ["--ray-address", "local"] if where == "ray" else []
    assert main(["sweep", spec, "--output-dir", out, *extra]) == 130
    assert "interrupted; 1 finished points kept" in capsys.readouterr().err
    assert len(list((tmp_path / "o" / "points").glob("*.json"))) == 1
    monkeypatch.undo()
    assert main(["sweep", spec, "--output-dir", out, "--no-plots"]) == 0
    assert "1 kept or invalid, 3 to run" in capsys.readouterr().err


def test_a_changed_slo_reranks_kept_points_without_running_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "o")
    assert main(["sweep", str(write_spec(tmp_path)), "--output-dir", out, "--no-plots"]) == 0
    tight = write_spec(tmp_path, slo={"ttft-p99": 0.0001})
    capsys.readouterr()
    assert main(["sweep", str(tight), "--output-dir", out, "--no-plots"]) == 1
    err = capsys.readouterr().err
    assert "4 kept or invalid, 0 to run" in err and "ttft p99" in err


def test_a_point_file_cut_short_is_run_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    spec = str(write_spec(tmp_path))
    assert main(["sweep", spec, "--output-dir", str(out), "--no-plots"]) == 0
    first = (out / "sweep.csv").read_text()
    cut = sorted((out / "points").glob("*.json"))[0]
    cut.write_text(cut.read_text()[:100])
    capsys.readouterr()
    assert main(["sweep", spec, "--output-dir", str(out), "--no-plots"]) == 0
    assert "3 kept or invalid, 1 to run" in capsys.readouterr().err
    assert (out / "sweep.csv").read_text() == first
    assert main(["sweep", spec, "--output-dir", str(out), "--no-plots"]) == 0
    assert "4 kept or invalid, 0 to run" in capsys.readouterr().err
