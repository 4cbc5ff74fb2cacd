"""`mocker sweep SPEC`: the grid's replays on local cores or Ray, into one table."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mocker.errors import ConfigError
from mocker.replay.command import check_output_dir, load_workload
from mocker.replay.trace import TraceRequest
from mocker.sweep.grid import Point, parse_point, points
from mocker.sweep.local import run_local
from mocker.sweep.on_ray import check_address, run_on_ray
from mocker.sweep.plot import pareto_plot
from mocker.sweep.point import Outcome
from mocker.sweep.spec import SweepSpec, load_spec
from mocker.sweep.store import PointStore
from mocker.sweep.table import best, closest, make_rows, misses, text_table, write_csv

__all__ = ["add_sweep_parser", "run_sweep"]

MAX_JOBS = 1024


def add_sweep_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sweep",
        help="replay a trace across a grid of configurations and find the cheapest within an SLO",
        description="Replay one trace (or synthetic workload) at every point of a grid of "
        "`mocker replay` flags (GPU, parallelism, batch limits, engines, router, tiers...), on "
        "this machine's cores or a Ray cluster, into one table: each point's cost in GPU-hours, "
        "its latencies and SLO attainment, the Pareto front, and the best point. Finished "
        "points are kept in --output-dir and not run again.",
    )
    p.add_argument("spec", metavar="SPEC", help="the sweep's YAML spec (docs/sweep.md)")
    p.add_argument(
        "--output-dir",
        default="sweep-out",
        metavar="DIR",
        help="where sweep.csv, pareto.png and the finished points go (sweep-out)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="points at once (default: this machine's cores; with Ray: the local cluster's CPUs)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run the points as tasks on the Ray cluster at ADDR (ray://host:10001, or "
        "'auto'); 'local' starts a one-node cluster in this process",
    )
    p.add_argument("--quiet", action="store_true", help="no progress and no table")
    p.add_argument("--no-plots", action="store_true", help="skip pareto.png")


def _jobs(args: argparse.Namespace) -> int:
    if args.jobs is None:
        return max(1, len(os.sched_getaffinity(0)))
    if not 1 <= args.jobs <= MAX_JOBS:
        raise ConfigError(f"invalid jobs={args.jobs!r}: must be in [1, {MAX_JOBS}]")
    return int(args.jobs)


@contextmanager
def _each_warning_once() -> Iterator[None]:
    """Checking a grid builds every point's configuration: a warning they share shows once
    (on mocker's handlers: records of its modules' loggers reach them, not its filters)."""
    seen: set[str] = set()

    def first(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        fresh = message not in seen
        seen.add(message)
        return fresh

    handlers = logging.getLogger("mocker").handlers
    for handler in handlers:
        handler.addFilter(first)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(first)


def _trace(spec: SweepSpec, todo: list[Point]) -> list[TraceRequest] | None:
    """The trace file's requests, read once for every point (None: synthetic, or no work)."""
    if spec.trace is None or not todo:
        return None
    return load_workload(parse_point(todo[0].argv), 0)


def _reporter(
    args: argparse.Namespace, total: int, done: dict[str, Outcome], store: PointStore
) -> tuple[Callable[[Point, Outcome], None], Callable[[], None]]:
    """What to call as each point ends (it is filed in `done`, and a finished one on disk at
    once: an interrupted sweep keeps it), and what closes the progress bar."""
    started = time.monotonic()
    count = 0

    def record(point: Point, outcome: Outcome) -> None:
        nonlocal count
        done[point.key] = outcome
        store.save(point.key, outcome)  # Ray's: a local worker filed its own
        count += 1
        if not args.quiet and not show:
            state = "ok" if "summary" in outcome else f"failed: {outcome['error']}"
            took = time.monotonic() - started
            print(f"mocker: point {point.index} ({point.label()}): {state} "
                  f"[{count}/{total}, {took:.0f} s]", file=sys.stderr)  # fmt: skip

    show = not args.quiet and sys.stderr.isatty()
    if not show:
        return record, lambda: None

    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task("sweeping", total=total)

    def advance(point: Point, outcome: Outcome) -> None:
        record(point, outcome)
        bar.advance(task)

    return advance, bar.stop


def run_sweep(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    jobs = _jobs(args)
    if args.ray_address is not None:
        check_address(args.ray_address)
    with _each_warning_once():
        grid = points(spec)
    if spec.prices:
        for point in grid:
            if point.invalid is None and point.gpu not in spec.prices:
                raise ConfigError(f"gpu-hour-price: no price for {point.gpu} (point "
                                  f"{point.index}: {point.label()})")  # fmt: skip
    check_output_dir(args.output_dir)
    out_dir = Path(args.output_dir)
    store = PointStore(out_dir)
    done: dict[str, Outcome] = {}
    for point in grid:
        kept = store.load(point.key) if point.invalid is None else None
        if kept is not None:
            done[point.key] = kept
    todo = [p for p in grid if p.invalid is None and p.key not in done]
    for point in todo:  # what a killed run left half written
        store.forget(point.key)
    if not args.quiet:
        print(f"mocker: {len(grid)} points: {len(grid) - len(todo)} kept or invalid, "
              f"{len(todo)} to run", file=sys.stderr)  # fmt: skip
    loaded = _trace(spec, todo)
    on_done, close = _reporter(args, len(todo), done, store)
    try:
        if args.ray_address is not None:
            run_on_ray(todo, loaded, args.ray_address, jobs, on_done)
        else:
            run_local(todo, loaded, store, jobs, on_done)
    except KeyboardInterrupt:
        close()
        finished = sum(1 for p in grid if "summary" in done.get(p.key, {}))
        print(f"mocker: interrupted; {finished} finished points kept in {store.dir}: the same "
              "command goes on from there", file=sys.stderr)  # fmt: skip
        return 130
    close()
    return _report(args, spec, grid, done, out_dir)


def _report(
    args: argparse.Namespace,
    spec: SweepSpec,
    grid: list[Point],
    done: dict[str, Outcome],
    out_dir: Path,
) -> int:
    rows = make_rows(grid, done, spec)
    write_csv(rows, out_dir / "sweep.csv")
    written = [out_dir / "sweep.csv"]
    if not args.no_plots:
        pareto_plot(rows, spec.slo, out_dir / "pareto.png")
        written.append(out_dir / "pareto.png")
    failed = [r for r in rows if r["status"].startswith("failed")]
    for row in failed:
        print(f"mocker: point {row['point']} {row['status']}", file=sys.stderr)
    chosen = best(rows)
    if not args.quiet:
        print(text_table(rows, list(spec.axes)))
        print("wrote " + ", ".join(map(str, written)))
    if chosen is None:
        near = closest(rows, spec.slo)
        where = ""
        if near is not None:
            where = (f"; the closest is point {near['point']} ({_label(near, spec)}): "
                     f"{misses(near, spec.slo)}")  # fmt: skip
        print(f"mocker: no point meets the SLO ({spec.slo.describe()}){where}", file=sys.stderr)
        return 1
    print(f"best: point {chosen['point']} ({_label(chosen, spec)}), {chosen['gpus']} GPUs, "
          f"{chosen['slo_attainment']:.1%} of requests within the SLO's bounds")  # fmt: skip
    return 1 if failed else 0


def _label(row: dict[str, object], spec: SweepSpec) -> str:
    return ", ".join(f"{a}={row[a]}" for a in spec.axes)
