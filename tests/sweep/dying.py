"""Workers that die (SIGKILL) on a point, for the local runner's retry tests."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

from mocker.replay.trace import TraceRequest
from mocker.sweep.local import file_point
from mocker.sweep.on_ray import ray_point
from mocker.sweep.point import Outcome
from mocker.sweep.store import PointStore

__all__ = ["die_always_on_eight", "die_always_on_ray", "die_first_time", "die_first_time_on_ray"]


def die_first_time(
    argv: list[str], key: str, loaded: list[TraceRequest] | None, store: PointStore
) -> None:
    """Killed on each point's first try; the second files it."""
    marker = store.dir / f"{key}.died"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    file_point(argv, key, loaded, store)


def die_always_on_eight(
    argv: list[str], key: str, loaded: list[TraceRequest] | None, store: PointStore
) -> None:
    """Killed whenever the point runs 8 sequences; files the others."""
    if argv[argv.index("--max-num-seqs") + 1] == "8":
        os.kill(os.getpid(), signal.SIGKILL)
    file_point(argv, key, loaded, store)


def die_first_time_on_ray(argv: list[str], loaded: list[TraceRequest] | None) -> Outcome:
    """A Ray task killed on each point's first try (markers in $SWEEP_TEST_MARKERS)."""
    marker = Path(os.environ["SWEEP_TEST_MARKERS"]) / hashlib.sha256(str(argv).encode()).hexdigest()
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return ray_point(argv, loaded)


def die_always_on_ray(argv: list[str], loaded: list[TraceRequest] | None) -> Outcome:
    """A Ray task killed every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    return ray_point(argv, loaded)
