"""Points on this machine's cores: a worker process a core, each taking one point at a
time; a point whose worker dies is run once more on a fresh one."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import traceback
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from mocker.errors import ConfigError
from mocker.replay.trace import TraceRequest
from mocker.sweep.grid import Point
from mocker.sweep.point import Outcome, execute_point, failure
from mocker.sweep.store import PointStore

__all__ = ["ATTEMPTS", "file_point", "run_local", "worker_loop"]

ATTEMPTS = 2  # a point whose worker dies is run once more, then reported failed


def file_point(
    argv: list[str], key: str, loaded: list[TraceRequest] | None, store: PointStore
) -> None:
    """Replay the point and file its outcome or the reason it failed (its output: KEY.log)."""
    log_path = store.log_path(key)
    try:
        with log_path.open("w", encoding="utf-8") as log:
            os.dup2(log.fileno(), 2)  # warnings and a traceback land beside the point's result
            try:
                outcome = execute_point(argv, loaded)
            except ConfigError as exc:
                outcome = failure(str(exc))
            except Exception as exc:  # a bug: its traceback in the log, one line in the table
                traceback.print_exc()
                outcome = failure(f"{type(exc).__name__}: {exc} (see {log_path})")
            sys.stderr.flush()
        if "error" in outcome:
            store.save_error(key, outcome["error"])
        else:
            store.save(key, outcome)
    finally:  # (an interrupted point too: an empty log says nothing)
        if log_path.exists() and log_path.stat().st_size == 0:
            log_path.unlink()


def worker_loop(
    conn: Connection,
    loaded: list[TraceRequest] | None,
    out_dir: str,
    run_one: Callable[[list[str], str, list[TraceRequest] | None, PointStore], None] = file_point,
) -> None:
    """A worker process: take (argv, key), file the point, say so; stop at None. The trace
    comes once, and what a replay sets up per process (GPU data) serves every point."""
    # Ctrl-C reaches the whole process group: the driver stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store = PointStore(Path(out_dir))
    while (task := conn.recv()) is not None:
        argv, key = task
        run_one(argv, key, loaded, store)
        conn.send(key)


class _Worker:
    """A worker process, its end of the pipe, and the point it is running."""

    def __init__(self, ctx: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
        self.proc.start()
        theirs.close()
        self.point: Point | None = None

    def give(self, point: Point) -> None:
        self.point = point
        self.conn.send((point.argv, point.key))

    def stop(self, *, kill: bool) -> None:
        if kill:
            self.proc.kill()
        else:
            with contextlib.suppress(OSError):
                self.conn.send(None)
        self.proc.join()
        self.conn.close()


def run_local(
    todo: list[Point],
    loaded: list[TraceRequest] | None,
    store: PointStore,
    jobs: int,
    on_done: Callable[[Point, Outcome], None],
    target: Callable[..., Any] = worker_loop,
) -> None:
    """Run the points on `jobs` worker processes, calling `on_done` as each ends."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    queue = deque(todo)
    tries: dict[str, int] = {}
    args = (loaded, str(store.dir.parent))
    workers = [_Worker(ctx, target, args) for _ in range(min(jobs, len(todo)))]

    def feed(worker: _Worker) -> None:
        if queue:
            point = queue.popleft()
            tries[point.key] = tries.get(point.key, 0) + 1
            worker.give(point)
        else:
            worker.point = None

    try:
        for worker in workers:
            feed(worker)
        while busy := [w for w in workers if w.point is not None]:
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]))
            for worker in busy:
                if worker.conn not in ready and worker.proc.sentinel not in ready:
                    continue
                point = worker.point
                assert point is not None
                try:
                    worker.conn.recv()
                except (EOFError, OSError):  # the worker died with the point
                    worker.stop(kill=True)
                    workers[workers.index(worker)] = worker = _Worker(ctx, target, args)
                    if tries[point.key] < ATTEMPTS:
                        queue.appendleft(point)
                    else:
                        why = f"its worker died {ATTEMPTS} times (see {store.log_path(point.key)})"
                        on_done(point, failure(why))
                else:
                    outcome = store.load(point.key)
                    reason = store.take_error(point.key)
                    on_done(point, outcome if outcome is not None else failure(reason or "?"))
                feed(worker)
    finally:
        for worker in workers:
            worker.stop(kill=worker.point is not None)
