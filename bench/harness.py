"""Shared by the benchmarks: pinning, servers on system-picked ports, /metrics, results."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
SERVER_CPU = 1
CLIENT_CPU = 0
MACHINE = "2 shared, noisy cores: server on cpu 1, client on cpu 0; compare ratios"
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0  # mocker's graceful shutdown may take up to 30 s; we do not wait that long
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The start-up line of `mocker serve` (and of bench/sse_baseline.py), with the bound port:
# "mocker X: serving NAMES at http://HOST:PORT/v1 (metrics at /metrics)".
SERVING_LINE = re.compile(r"serving .* at http://(\S+):(\d+)/v1")

T = TypeVar("T")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    """The benchmark's result: one JSON object, the last line on stdout."""
    print(json.dumps(result), flush=True)


def percentile(samples: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None when there are no samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def attempt(errors: list[str], label: str, fn: Callable[[], T]) -> T | None:
    """Run one part; a failure is logged and recorded in `errors` instead of ending the run."""
    try:
        return fn()
    except Exception as exc:
        log(f"  {label} FAILED: {exc!r}")
        errors.append(f"{label}: {exc!r}"[:500])
        return None


# -- cores ------------------------------------------------------------------------------------


def pin(cpu: int) -> None:
    """This process (and the threads and children it starts from now on) on one core."""
    os.sched_setaffinity(0, {cpu})


def pinned(argv: list[str], cpu: int = SERVER_CPU) -> list[str]:
    # taskset execs the command, so the child's pid is the command's own (for /proc stat).
    return ["taskset", "-c", str(cpu), *argv]


def cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of the whole process (all threads), from /proc/PID/stat: the time in
    its own code and in the kernel on its behalf (socket writes, mostly)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads)."""
    return sum(cpu_split(pid))


def client_setup(name: str) -> Path:
    """Pins this client to its core; returns a fresh directory for the server logs."""
    pin(CLIENT_CPU)
    logs = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    log(f"server logs in {logs}; server on cpu {SERVER_CPU}, client on cpu {CLIENT_CPU}")
    return logs


# -- servers ----------------------------------------------------------------------------------


def mocker_argv(speedup: float, *flags: str) -> list[str]:
    """`mocker serve` on loopback, on a port the server picks (--port 0), quiet uvicorn logs,
    serving its default model under the name the benchmark clients ask for (`mocker`)."""
    return [
        sys.executable, "-m", "mocker", "serve",
        "--host", HOST, "--port", "0",
        "--served-model-name", "mocker",
        "--speedup-ratio", str(speedup),
        *flags,
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip


@dataclass(slots=True)
class Server:
    """A started server process, its port (once it has said it) and where its output goes."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_issues(self) -> list[str]:
        """Lines of the server log that look like trouble (tracebacks, errors, warnings)."""
        marks = ("Traceback", "Error", "ERROR", "WARNING", "Exception", "exception")
        return [line for line in self.log_text().splitlines() if any(m in line for m in marks)]


def _until(server: Server, deadline: float, ready: Callable[[], T | None]) -> T:
    """Poll `ready` until it returns a value; fails if the server exits or the deadline passes."""
    while time.monotonic() < deadline:
        value = ready()
        if value is not None:
            return value
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited at start-up:\n{server.log_tail()}")
        time.sleep(0.05)
    raise RuntimeError(f"{server.name} not up after {STARTUP_TIMEOUT_S:.0f}s:\n{server.log_tail()}")


def _announced_port(server: Server) -> int | None:
    match = SERVING_LINE.search(server.log_text())
    return None if match is None else int(match[2])


def _healthy(server: Server) -> bool | None:
    url = f"http://{HOST}:{server.port}/health"
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
        return True if response.status == 200 else None
    return None


def stop(server: Server) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; logs how long the server took to go."""
    proc = server.proc
    if proc.poll() is not None:
        log(f"  {server.name} had already exited with code {proc.returncode}")
        return
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
        how = f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)
        how = f"SIGKILL, still up {STOP_TIMEOUT_S:.0f}s after SIGTERM"
    log(f"  {server.name} stopped in {time.monotonic() - began:.2f}s: {how}")


@contextlib.contextmanager
def running(name: str, argv: list[str], log_dir: Path) -> Iterator[Server]:
    """A fresh server on the server's core, healthy on entry, always stopped on exit.

    The server binds a free port itself and names it in its start-up line, read back from
    its log: no port is picked here and handed over later, for someone else to take.
    """
    fd, log_path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=log_dir)
    with os.fdopen(fd, "wb") as log_file:
        proc = subprocess.Popen(
            pinned(argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    server = Server(name, proc, Path(log_path))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        server.port = _until(server, deadline, lambda: _announced_port(server))
        _until(server, deadline, lambda: _healthy(server))
        yield server
    finally:
        stop(server)


# -- /metrics ---------------------------------------------------------------------------------

# What to read from a scrape: result key -> (metric name, labels a sample must carry).
Wanted = dict[str, tuple[str, dict[str, str]]]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples over the label sets that carry all of `labels`. Found by a
    regex (C-level), not a Python pass over every line: benchmarks sample /metrics on the
    event loop that reads their streams."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    pattern = rf"^{re.escape(name)}(\{{[^\n]*\}})? (\S+)$"
    return sum(
        float(value)
        for head, value in re.findall(pattern, text, re.MULTILINE)
        if all(w in head for w in wanted)
    )


def counters(text: str, wanted: Wanted) -> dict[str, float]:
    return {key: metric(text, name, **labels) for key, (name, labels) in wanted.items()}


def deltas(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """What each counter gained between two `counters` readings."""
    return {key: after[key] - before[key] for key in after}
