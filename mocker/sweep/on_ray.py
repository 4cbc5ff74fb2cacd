"""Points on a Ray cluster: one task a point, the trace shipped once, a lost worker's task
retried once by Ray."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from mocker import __version__
from mocker.errors import ConfigError
from mocker.replay.trace import TraceRequest
from mocker.sweep.grid import Point
from mocker.sweep.point import Outcome, execute_point, failure

__all__ = ["check_address", "ray_point", "run_on_ray"]


def ray_point(argv: list[str], loaded: list[TraceRequest] | None) -> Outcome:
    """A Ray task: the point's outcome, or the reason it could not run."""
    try:
        return execute_point(argv, loaded)
    except ConfigError as exc:
        return failure(str(exc))
    except Exception as exc:  # a bug: named in the table; Ray's log holds the rest
        return failure(f"{type(exc).__name__}: {exc}")


def _lost(ray: Any, exc: Exception) -> str:
    """Why Ray gave a task up: its worker (or node) died on both tries, or something else
    (e.g. a node that cannot load mocker), named by Ray's first line."""
    name = type(exc).__name__
    if isinstance(exc, ray.exceptions.WorkerCrashedError | ray.exceptions.NodeDiedError):
        return f"its worker died twice ({name})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"Ray: {name}: {first}"[:500]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray-address: Ray is not installed here (pip install 'mocker[ray]')"
        ) from None
    return ray


def check_address(address: str) -> None:
    """Ray is here and the cluster's address answers (Ray itself waits minutes on one that
    does not)."""
    _ray()
    if address in ("local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address}: expected HOST:PORT, ray://HOST:PORT, "
                          "auto or local")  # fmt: skip
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise ConfigError(f"--ray-address {address}: cannot join the cluster: "
                          f"{exc.strerror or exc}") from None  # fmt: skip


def run_on_ray(
    todo: list[Point],
    loaded: list[TraceRequest] | None,
    address: str,
    jobs: int,
    on_done: Callable[[Point, Outcome], None],
    target: Callable[[list[str], list[TraceRequest] | None], Outcome] = ray_point,
) -> None:
    """Run the points as Ray tasks on the cluster at `address` ("local": a new one-node
    cluster of `jobs` CPUs in this process), calling `on_done` as each ends."""
    ray = _ray()
    local = address == "local"
    try:
        ray.init(
            address=address,
            num_cpus=jobs if local else None,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"--ray-address {address}: cannot join the cluster: {exc}") from None
    try:
        # Ray runs a task again when its worker dies; an error in the replay is no crash.
        task = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(target)
        shared = ray.put(loaded)  # once into the object store, not once per task
        refs = {task.remote(point.argv, shared): point for point in todo}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                point = refs.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    outcome = failure(_lost(ray, exc))
                if outcome.get("mocker", __version__) != __version__:
                    theirs = outcome["mocker"]
                    outcome = failure(f"the worker runs mocker {theirs}, this driver "
                                      f"{__version__}: install the same on every node")  # fmt: skip
                on_done(point, outcome)
    finally:
        ray.shutdown()
