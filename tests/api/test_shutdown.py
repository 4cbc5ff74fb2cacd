"""SIGTERM on a real `mocker serve`: drain with 503s, in-flight streams finish or are aborted
with an error event at --shutdown-timeout, exit 0 without a traceback."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from tests.support.servers import serve, stderr_of


def stream_events(response: httpx.Response) -> Iterator[Any]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def completion(max_tokens: int) -> dict[str, object]:
    return {"model": "mocker", "prompt": "hello", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}  # fmt: skip


def test_sigterm_drains_then_exits_0() -> None:
    # At a fifth of the modelled speed a short prompt's decode pass takes ~40 ms: 100 tokens
    # stream for 4 s (a loaded machine only makes that longer).
    with (
        serve("--speedup-ratio", "0.2") as (proc, url),
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        with http.stream("POST", "/v1/completions", json=completion(100)) as response:
            events = stream_events(response)
            first = next(events)  # the stream is under way
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while http.get("/health").status_code != 503:  # the drain starts at the next tick
                assert time.monotonic() < deadline, "no drain after SIGTERM"
                time.sleep(0.02)
            late = http.post("/v1/completions", json={**completion(4), "stream": False})
            assert late.status_code == 503
            assert "shutting down" in late.json()["error"]["message"]
            assert http.get("/health").status_code == 503
            assert http.get("/metrics").status_code == 200  # still scrapeable
            rest = list(events)
        assert rest[-1] == "[DONE]"
        chunks = [first, *rest[:-1]]
        assert all("error" not in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=10) == 0
        err = stderr_of(proc)
        assert "Traceback" not in err and "draining: 1 requests in flight" in err


def test_shutdown_timeout_aborts_with_an_error_event() -> None:
    with (
        serve("--shutdown-timeout", "0.5") as (proc, url),
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        with http.stream("POST", "/v1/completions", json=completion(2000)) as response:
            events = stream_events(response)
            next(events)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = list(events)
        # 0.5 s (plus a loaded machine's delays), not the ~14 s or more the stream needed.
        assert time.monotonic() - sent < 10
        assert rest[-1] == "[DONE]"
        error = rest[-2]["error"]
        assert error["code"] == 503 and "aborted" in error["message"]
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in stderr_of(proc)


def test_a_drain_waits_for_output_held_by_jitter_then_sends_it() -> None:
    # At speedup 0.005 a short prompt's first token takes ~3.3 s; with --seed 35 the first
    # jitter draw is 9.77 of a possible 10, so the client would get it ~32 s later still.
    # The engine is done long before: the drain must wait for the response, not the engine,
    # and at --shutdown-timeout send what is held rather than cut the connection.
    flags = ("--speedup-ratio", "0.005", "--ttft-jitter", "10", "--shutdown-timeout", "1",
             "--seed", "35")  # fmt: skip
    with serve(*flags) as (proc, url), httpx.Client(base_url=url, timeout=60) as http:
        result: dict[str, object] = {}

        def client() -> None:
            with http.stream("POST", "/v1/completions", json=completion(1)) as response:
                result["events"] = list(stream_events(response))

        reader = threading.Thread(target=client)
        reader.start()
        deadline = time.monotonic() + 20
        while not re.search(
            r"^vllm:request_success_total\{.*\} [1-9]", http.get("/metrics").text, re.M
        ):
            assert time.monotonic() < deadline  # until the engine has finished the request
            time.sleep(0.05)
        assert "events" not in result
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        reader.join(timeout=30)
        assert proc.wait(timeout=10) == 0
        # The timeout (1 s, plus a loaded machine's delays) released it, not the hold (~32 s).
        assert time.monotonic() - sent < 15
        assert "Traceback" not in stderr_of(proc)
    events = result["events"]
    assert isinstance(events, list) and events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_a_request_stalled_mid_upload_neither_holds_the_drain_nor_leaves_a_traceback() -> None:
    with serve("--shutdown-timeout", "30") as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                b"\r\nContent-Length: 100\r\n\r\n{"  # 1 byte of 100, and no more
            )
            # Answered on the same event loop, after it has read the stalled request's head
            # (which was in before this connection was made).
            assert httpx.get(url + "/health", timeout=30).status_code == 200
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            sock.settimeout(20)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
            # Not accepted yet, so not waited for: uvicorn's 5 s for open connections, not 30.
            assert proc.wait(timeout=20) == 0
            assert time.monotonic() - sent < 15
        assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        assert b'"code":503' in reply
        assert "Traceback" not in stderr_of(proc)
