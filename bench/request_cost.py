"""A whole request's CPU without sockets: N concurrent streamed completions through uvicorn's
HTTP protocol and the app on stand-in transports, mocker against the bare SSE floor.

Run from the repo root with no arguments: `.venv/bin/python bench/request_cost.py`. Progress
goes to stderr; the last stdout line is one JSON object.

What `bench/serve_stream.py` measures end to end, less the kernel: the socket writes cost both
servers the same, so what is left is each server's own user CPU per request, which sockets'
noise hides. Each run is a child process (a fresh interpreter, as a server starts) pinned to
the server's core. It builds the app as its server does (`mocker serve` with serve_stream.py's
flags, or bench/sse_baseline.py's app), starts its lifespan, and feeds uvicorn's
HttpToolsProtocol one connection per request, whose transport counts the bytes written and
ends the request when it is closed (`Connection: close`, as the benchmark's client). A
warm-up batch, then BATCHES batches of STREAMS concurrent requests; per batch the process's
user CPU per request, and for mocker the cyclic collector's share (a `gc.callbacks` timer).

Two loads: 2 tokens a stream (a request's own cost) and 200 (serve_stream.py's throughput
load). ROUNDS rounds, mocker and the floor alternating; medians of the runs' medians, and the
ratio mocker / floor per round. The machine has two shared, noisy cores: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import MACHINE, ROOT, SERVER_CPU, emit, log, pin

STREAMS = 500
LOADS = (2, 200)  # tokens a stream
BATCHES = 6
ROUNDS = 5
PROMPT_LEN = 64
RUN_TIMEOUT_S = 300
# `mocker serve` as bench/serve_stream.py starts it.
SERVE_FLAGS = ["--speedup-ratio", "1000", "--max-num-seqs", "1024",
               "--max-num-batched-tokens", "8192", "--num-gpu-blocks-override", "65536",
               "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]  # fmt: skip


class _Transport:
    """A connection's transport for uvicorn's protocol: it counts what is written; `close`
    ends the request (the protocol closes it once a `Connection: close` response is done)."""

    def __init__(self, done: asyncio.Future[int]) -> None:
        self.written = 0
        self.closing = False
        self.done = done

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writelines(self, data: list[bytes]) -> None:
        self.written += sum(map(len, data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.done.set_result(self.written)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def get_write_buffer_size(self) -> int:
        return 0

    def set_protocol(self, protocol: Any) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _mocker_app() -> Any:
    """The app `mocker serve` builds from these flags (mocker.cli)."""
    from mocker import cli
    from mocker.api.app import create_app

    args = cli._parser().parse_args(["serve", *SERVE_FLAGS])
    given = argparse.Namespace(
        **{k: v for k, v in vars(args).items() if k not in ("command", "model_tag", "config")}
    )
    values, _ = cli.resolve(given, cli.ENGINE_OPTIONS + cli.SERVER_OPTIONS, config_file=None)
    settings = cli.server_settings_from(values)
    tokenizer = cli.load_tokenizer(settings.tokenizer, settings.chat_template)
    return create_app(settings, cli.engine_config_from(values), tokenizer)


def _floor_app() -> Any:
    import sse_baseline  # (bench/, this script's folder, is on the path)

    return sse_baseline.app


async def _run(mode: str, max_tokens: int) -> dict[str, float]:
    import uvicorn
    from sse_client import completion_body, completion_request
    from uvicorn.lifespan.on import LifespanOn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    app = _mocker_app() if mode == "mocker" else _floor_app()
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    config.load()
    lifespan = LifespanOn(config)
    await lifespan.startup()
    state = ServerState()
    loop = asyncio.get_running_loop()
    requests = [
        completion_request(
            "127.0.0.1", 8000,
            completion_body(list(range(1000 + i * PROMPT_LEN, 1000 + (i + 1) * PROMPT_LEN)),
                            max_tokens),
        )
        for i in range(STREAMS)
    ]  # fmt: skip

    async def one(raw: bytes) -> int:
        done: asyncio.Future[int] = loop.create_future()
        protocol = HttpToolsProtocol(config, state, app_state={})
        protocol.connection_made(_Transport(done))  # type: ignore[arg-type]
        protocol.data_received(raw)
        return await done

    async def batch() -> list[int]:
        return await asyncio.gather(*map(one, requests))

    collector = [0.0]
    started: list[float] = []

    def timer(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            collector[0] += time.perf_counter() - started.pop()

    written = await batch()  # warm-up
    gc.callbacks.append(timer)
    user: list[float] = []
    gc_share: list[float] = []
    for _ in range(BATCHES):
        collector[0] = 0.0
        before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        written = await batch()
        user.append((resource.getrusage(resource.RUSAGE_SELF).ru_utime - before) / STREAMS)
        gc_share.append(collector[0] / STREAMS)
    gc.callbacks.remove(timer)
    await lifespan.shutdown()
    if min(written) <= 0:
        raise RuntimeError(f"{mode}: a response wrote nothing")
    return {
        "user_us_per_request": statistics.median(user) * 1e6,
        "gc_us_per_request": statistics.median(gc_share) * 1e6,
        "bytes_per_request": statistics.median(written),
    }


def child(mode: str, max_tokens: int) -> int:
    import uvloop

    pin(SERVER_CPU)
    result = uvloop.run(_run(mode, max_tokens))
    print(json.dumps(result), flush=True)
    return 0


def run_child(mode: str, max_tokens: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(max_tokens)],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    log(
        f"  {mode:6s} {max_tokens:3d} tokens: user {result['user_us_per_request']:.1f} us a "
        f"request (collector {result['gc_us_per_request']:.1f}), "
        f"{result['bytes_per_request']:.0f} bytes"
    )
    return result


def main() -> int:
    started = time.perf_counter()
    loads: list[dict[str, Any]] = []
    for max_tokens in LOADS:
        runs: dict[str, list[dict[str, float]]] = {"mocker": [], "floor": []}
        for i in range(ROUNDS):
            for mode in ("mocker", "floor") if i % 2 == 0 else ("floor", "mocker"):
                runs[mode].append(run_child(mode, max_tokens))

        def median(mode: str, key: str, runs: dict[str, list[dict[str, float]]] = runs) -> float:
            return round(statistics.median(r[key] for r in runs[mode]), 1)

        ratios = [
            round(m["user_us_per_request"] / f["user_us_per_request"], 2)
            for m, f in zip(runs["mocker"], runs["floor"], strict=True)
        ]
        load = {
            "max_tokens": max_tokens,
            "mocker_user_us_per_request": median("mocker", "user_us_per_request"),
            "mocker_gc_us_per_request": median("mocker", "gc_us_per_request"),
            "floor_user_us_per_request": median("floor", "user_us_per_request"),
            "ratio": statistics.median(ratios),
            "ratio_runs": ratios,
            "mocker_us_per_token": round(median("mocker", "user_us_per_request") / max_tokens, 2),
        }
        log(f"{max_tokens} tokens a stream: {load}")
        loads.append(load)
    emit({
        "streams": STREAMS, "batches": BATCHES, "rounds": ROUNDS, "loads": loads,
        "wall_s": round(time.perf_counter() - started, 1), "machine": MACHINE,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], int(sys.argv[3])))
    sys.exit(main())
