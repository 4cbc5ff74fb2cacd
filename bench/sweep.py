"""How long `mocker sweep examples/sweep.yaml` takes on local cores and on a local Ray
cluster, against its baseline: the same points as one `mocker replay` after another."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from harness import ROOT, emit, log

# Run from the repo root with no arguments: `.venv/bin/python bench/sweep.py`.
# Both cores go to the sweep (its workers are the point); nothing else is served, so there
# is no server and client to pin apart. Progress goes to stderr, the last stdout line is
# one JSON object. The trace is read from ../shared and never copied into the project.
SPEC = ROOT / "examples" / "sweep.yaml"
MOCKER = str(Path(sys.executable).parent / "mocker")
JOBS = 2
TIMEOUT_S = 540


def _sweep(out: Path, *extra: str) -> float:
    started = time.perf_counter()
    cmd = [MOCKER, "sweep", str(SPEC), "--output-dir", str(out), "--no-plots", "--quiet",
           "--jobs", str(JOBS), *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def _one_by_one(rows: list[dict[str, str]], out: Path) -> tuple[float, int]:
    """Each point as its own `mocker replay`, in turn; how many agree with the sweep's row."""
    spec = yaml.safe_load(SPEC.read_text())
    trace = str((SPEC.parent / spec["trace"]).resolve())
    shared = [a for k, v in spec["flags"].items() for a in (f"--{k}", str(v))]
    started = time.perf_counter()
    agree = 0
    for row in rows:
        point = [a for k in spec["axes"] for a in (f"--{k}", row[k])]
        cmd = [MOCKER, "replay", trace, *shared, *point, "--output-dir", str(out), "--quiet",
               "--no-plots"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=TIMEOUT_S)
        summary = json.loads((out / "summary.json").read_text())
        agree += f"{summary['ttft_s']['p90']}" == row["ttft_p90_s"]
    return time.perf_counter() - started, agree


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        log(f"sweep of {SPEC.name} on {JOBS} local worker processes")
        local_s = _sweep(base / "local")
        log("the same on a local Ray cluster")
        ray_s = _sweep(base / "ray", "--ray-address", "local")
        table = (base / "local" / "sweep.csv").read_text()
        rows = list(csv.DictReader(table.splitlines()))
        log(f"baseline: the {len(rows)} points as one `mocker replay` after another")
        serial_s, agree = _one_by_one(rows, base / "one")
        best = next((r for r in rows if r["best"] == "True"), None)
        shown = ("point", "gpu", "gpus", "cost_usd", "slo_attainment")
        emit(
            {
                "bench": "sweep",
                "spec": "examples/sweep.yaml",
                "points": len(rows),
                "jobs": JOBS,
                "local_s": round(local_s, 1),
                "ray_local_s": round(ray_s, 1),
                "baseline_one_replay_after_another_s": round(serial_s, 1),
                "speedup_local_vs_baseline": round(serial_s / local_s, 2),
                "ray_table_equals_local": table == (base / "ray" / "sweep.csv").read_text(),
                "rows_equal_to_their_replay": f"{agree}/{len(rows)}",
                "best": None if best is None else {k: best[k] for k in shown},
            }
        )


if __name__ == "__main__":
    main()
