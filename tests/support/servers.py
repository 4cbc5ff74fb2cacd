"""Apps over a fast engine, an in-process client, real servers (threads and subprocesses)."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from mocker.api.app import create_app
from mocker.config import EngineConfig
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer, load_tokenizer

FAST = {"speedup_ratio": 200.0, "num_gpu_blocks": 4096, "max_model_len": 4096}

_TOKENIZER: TextTokenizer | None = None


def tokenizer() -> TextTokenizer:
    """The default tokenizer, loaded once per test session (loading takes ~0.5 s)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_tokenizer()
    return _TOKENIZER


def make_app(settings: ServerSettings | None = None, **engine: Any) -> FastAPI:
    config = EngineConfig(**{**FAST, **engine})
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen[str], url: str, timeout: float = 30) -> None:
    """Until `mocker serve` in `proc` answers /health with 200 (fails if it exits first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)


@contextmanager
def serve(*flags: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    argv = [sys.executable, "-m", "mocker", "serve", "--port", str(port),
            "--disable-uvicorn-access-log", *flags]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # stderr to a file: a pipe nobody reads could fill up and block the server.
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, text=True)
        proc.log = log  # type: ignore[attr-defined]
        try:
            wait_healthy(proc, url)
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def stderr_of(proc: subprocess.Popen[str]) -> str:
    proc.log.seek(0)  # type: ignore[attr-defined]
    return proc.log.read()  # type: ignore[attr-defined,no-any-return]


class ServerThread:
    """A real uvicorn server on a free loopback port, in a background thread."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
