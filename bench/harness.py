"""Shared by the benchmarks: start `mocker serve` pinned to a core, wait for it, stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
SERVER_CPU = 1
CLIENT_CPU = 0
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0  # mocker's graceful shutdown may take up to 30 s; we do not wait that long
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(samples: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None when there are no samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def free_port() -> int:
    # Bind-and-release: a tiny race with other processes, acceptable on a bench machine.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# -- servers ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Server:
    """A started server process and where its output goes."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def log_issues(self) -> list[str]:
        """Lines of the server log that look like trouble (tracebacks, errors, warnings)."""
        marks = ("Traceback", "Error", "ERROR", "WARNING", "Exception", "exception")
        text = self.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if any(m in line for m in marks)]


def wait_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    url = f"http://{HOST}:{server.port}/health"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited at start-up:\n{server.log_tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not healthy after {STARTUP_TIMEOUT_S:.0f}s")


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
def running(name: str, argv_for: Callable[[int], list[str]], log_dir: Path) -> Iterator[Server]:
    """A fresh server on core 1 and a free port, healthy on entry, always stopped on exit."""
    port = free_port()
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as log_file:
        # taskset execs the command, so proc.pid is the server's own pid (for /proc stat).
        proc = subprocess.Popen(
            ["taskset", "-c", str(SERVER_CPU), *argv_for(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    server = Server(name, port, proc, log_path)
    try:
        wait_healthy(server)
        yield server
    finally:
        stop(server)


# -- the streaming client ---------------------------------------------------------------------
