"""`mocker sweep` end to end: the table, the best point, resuming, exit codes, bad input."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from mocker.cli import main
from tests.sweep.specs import write_spec


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
    assert "the closest is point" in err and "of requests within it" in err


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"axes": {"bogus": [1, 2]}}, "mocker: axes: unknown flag --bogus"),
        ({"axes": {"num-engines": []}}, "mocker: axes: --num-engines must be a non-empty list"),
        ({"trace": "missing.jsonl"}, "mocker: trace: cannot read"),
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
