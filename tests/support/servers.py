"""Apps over a fast engine, an in-process client, real servers (threads and subprocesses)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import IO, Any

import httpx
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from mocker.api.app import create_app
from mocker.config import EngineConfig
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer, load_tokenizer

FAST: dict[str, Any] = {"speedup_ratio": 200.0, "num_gpu_blocks": 4096, "max_model_len": 4096}
# The model-agnostic `mocker serve` the serving tests run: a model name only, timed by
# Dynamo's polynomial (the GPU timing has tests of its own).
AGNOSTIC = ("--model", "mocker", "--timing-model", "polynomial")

_TOKENIZER: TextTokenizer | None = None


def tokenizer() -> TextTokenizer:
    """The default tokenizer, loaded once per test session (loading takes ~0.5 s)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_tokenizer()
    return _TOKENIZER


def make_app(settings: ServerSettings | None = None, **engine: Any) -> FastAPI:
    config = EngineConfig.of(**{**FAST, **engine})
    return create_app(settings or ServerSettings(), config, tokenizer())


def settings(**changes: Any) -> ServerSettings:
    return replace(ServerSettings(), **changes)


class AppClient:
    """An httpx client on the ASGI app, with the engine running (no sockets)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state.mocker
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://mocker", timeout=30
        )

    async def __aenter__(self) -> AppClient:
        self.state.engines.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.state.engines.stop()
        for channel in self.state.side_channels:  # P/D (the app's lifespan would close them)
            await channel.close()


# `mocker serve`'s start-up line names the port it bound (with --port 0, the system's pick).
_SERVING = re.compile(r"^mocker \S+: serving .* at (https?)://(\S+):(\d+)/v1 ", re.M)


def wait_healthy(proc: subprocess.Popen[str], url: str, timeout: float = 30) -> None:
    """Until `mocker serve` in `proc` answers /health with 200 (fails if it exits first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            # (a TLS server's self-signed certificate: trusted here, checked by the test)
            if httpx.get(url + "/health", timeout=1, verify=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)


class LoggedProcess(subprocess.Popen[str]):
    """A child process in text mode whose stderr goes to `log`, a file read while the child
    runs (stderr_of): a pipe nobody reads could fill up and block it."""

    def __init__(
        self,
        argv: Sequence[str],
        log: IO[str],
        *,
        stdout: int | IO[str] = subprocess.DEVNULL,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(argv, stdout=stdout, stderr=log, text=True, env=env)
        self.log = log


def served_url(proc: LoggedProcess, timeout: float = 30) -> str:
    """The URL `mocker serve` in `proc` (started by serve()) says it listens at, read from its
    start-up line on stderr (fails if the process exits first)."""
    deadline = time.monotonic() + timeout
    while not (found := _SERVING.search(stderr_of(proc))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no start-up line from mocker serve:\n{stderr_of(proc)}")
        time.sleep(0.05)
    return f"{found[1]}://{found[2]}:{found[3]}"


@contextmanager
def serve(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[LoggedProcess, str]]:
    """`python -m mocker serve --port 0 ARGS` (the system picks the port, so it cannot be
    taken by the time the server binds it): yields the process once /health answers, and
    its URL as its start-up line names it. Unless ARGS name a model (by flag or first, as
    `vllm serve MODEL`) or a timing model, the server is the model-agnostic one (AGNOSTIC:
    model "mocker", Dynamo's polynomial)."""
    positional_model = bool(args) and not args[0].startswith("-")
    if not positional_model and not any(a.split("=")[0] in ("--model", "--timing-model")
                                        for a in args):  # fmt: skip
        args = (*AGNOSTIC, *args)
    argv = [sys.executable, "-m", "mocker", "serve", "--port", "0",
            "--disable-uvicorn-access-log", *args]  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        proc = LoggedProcess(argv, log, env=env)
        try:
            url = served_url(proc)
            wait_healthy(proc, url)
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def stderr_of(proc: LoggedProcess) -> str:
    return read_shared(proc.log)


def read_shared(file: IO[str]) -> str:
    """What a running child wrote to `file` (its stdout or stderr) so far. Read with `pread`,
    which leaves the file's offset alone: the child shares that offset, and a `seek(0)` here
    could land one of its writes over the start of the file (a start-up line would lose its
    first character)."""
    fd = file.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", errors="replace")


class ServerThread:
    """A real uvicorn server on a loopback port, in a background thread.

    The listening socket is bound here, to port 0, and handed to uvicorn: the port is the
    system's pick and held from the start, never chosen first and bound later."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()


def scrape(url: str, *labels: str) -> dict[tuple[str, str | None], float]:
    """Every sample of the server's /metrics by (name, the first of `labels` it has set)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, _first_label(s.labels, labels)): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _first_label(values: dict[str, str], names: tuple[str, ...]) -> str | None:
    """`values[names[0]] or values[names[1]] or ...`, a missing name read as None."""
    value: str | None = None
    for name in names:
        value = value or values.get(name)
    return value
