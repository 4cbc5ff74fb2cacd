"""The streaming core without HTTP: mocker's engine and renderers writing to N TCP connections,
against a bare writer of pre-encoded chunks on the same kind of connections.

Run from the repo root with no arguments: `.venv/bin/python bench/stream_core.py`. Progress
goes to stderr; the last stdout line is one JSON object.

What `bench/serve_stream.py` measures end to end, less the HTTP layer and the requests' own
set-up, so that a change to the pass or the hand-out shows in figures that hold still: each
run is a child process pinned to the server's core, with N loopback connections (uvloop
transports, TCP_NODELAY) whose other ends a reader process drains on the client's core.

- `mocker`: an EngineCore (the default tokenizer's palette) with N requests decoding (64-token
  prompts, ignore_eos), each with the server's renderer and emitter on a uvicorn
  RequestResponseCycle over its connection; every pass is stepped and handed out at once
  (the live loop's work without its clock);
- `floor`: per pass, one pre-framed chunk of the same size written to every connection.

Per run: the child's user and kernel CPU time per token over PASSES passes after a warm-up,
and in `mocker` runs the pass (`step()`) and the hand-out apart. ROUNDS rounds, the two
alternating (who goes first swaps every round); medians and the ratio per round. The
machine has two shared, noisy cores: compare ratios within one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import CLIENT_CPU, MACHINE, ROOT, SERVER_CPU, emit, log, pin

STREAMS = 500
PROMPT_LEN = 64
WARMUP_PASSES = 30
PASSES = 300
ROUNDS = 5
RUN_TIMEOUT_S = 300
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}


def _reader(listener: socket.socket, n: int) -> None:
    """Accept n connections and drain them until each closes (the client's side); gone as
    soon as the process that forked it is (a run that failed before connecting them all)."""
    import selectors

    parent = os.getppid()
    pin(CLIENT_CPU)
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ)
    closed = 0
    while closed < n:
        events = sel.select(timeout=1.0)
        if not events and os.getppid() != parent:
            return
        for key, _ in events:
            sock: Any = key.fileobj
            if sock is listener:
                conn, _addr = listener.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(sock)
                sock.close()
                closed += 1


async def _connections(port: int, n: int) -> list[Any]:
    loop = asyncio.get_running_loop()
    transports = []
    for _ in range(n):
        transport, _protocol = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transports.append(transport)
    return transports


def _cycle(transport: Any) -> Any:
    """uvicorn's httptools cycle over `transport`, as the server's direct writer sees it."""
    import logging

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    scope: Any = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    log_ = logging.getLogger("stream_core")
    return RequestResponseCycle(
        scope,
        transport,
        FlowControl(transport),
        log_,
        log_,
        False,
        [],
        asyncio.Event(),
        False,
        True,
        lambda: None,
    )


async def _mocker(transports: list[Any]) -> dict[str, float]:
    from mocker.api.choice import Choice
    from mocker.api.chunks import ChunkWriter
    from mocker.api.lifecycle import OpenResponse, OpenResponses
    from mocker.api.responses import Emitter
    from mocker.api.stream import StreamRenderer
    from mocker.api.text_table import sinks, text_table
    from mocker.config import EngineConfig
    from mocker.engine.core import EngineCore
    from mocker.engine.stream import RequestStream, deliver, deliver_loop
    from mocker.request import EngineRequest, SamplingParams
    from mocker.tokenizer import default_tokenizer_path, load_tokenizer

    tokenizer = load_tokenizer(default_tokenizer_path())
    table = text_table(tokenizer.escaped_pieces)
    config = EngineConfig.of(
        max_num_seqs=1024, max_num_batched_tokens=8192, num_gpu_blocks=65536, speedup_ratio=1000.0
    )
    core = EngineCore(config, output_palette=tokenizer.palette)
    streams: dict[str, RequestStream] = {}
    responses = OpenResponses()
    for i, transport in enumerate(transports):
        rid = f"cmpl-{i:032x}-0"
        prompt = list(range(1000 + PROMPT_LEN * i, 1000 + PROMPT_LEN * (i + 1)))
        sampling = SamplingParams(max_tokens=10 * (WARMUP_PASSES + PASSES), ignore_eos=True)
        core.add_request(EngineRequest(rid, prompt, sampling))
        stream = streams[rid] = RequestStream(rid)
        choice = Choice(
            index=0, request_id=rid, engine=None, stream=stream, num_prompt_tokens=PROMPT_LEN
        )
        writer = ChunkWriter(
            chat=False,
            response_id=rid,
            created=int(time.time()),
            model="mocker",
            include_usage=True,
            continuous_usage=False,
        )
        renderer = StreamRenderer(
            OpenResponse([choice], responses),
            writer,
            escaped=tokenizer.escaped_piece,
            known=tokenizer.escaped_pieces,
            piece=tokenizer.piece,
            record_abort=lambda: None,
            framed=None if table is None else table.framed,
            sinks=sinks(table),
        )
        cycle = _cycle(transport)
        emitter = Emitter(cycle.send, lambda: None)
        await cycle.send(START)
        emitter.started()
        renderer.attach(emitter)
    loop = deliver_loop()
    now = 0.0
    for _ in range(WARMUP_PASSES):
        result = core.step(now)
        now = result.end
        deliver(streams, result, loop)
    _serving_gc()
    step_ns = hand_out_ns = tokens = 0
    before = os.times()
    for _ in range(PASSES):
        t0 = time.perf_counter_ns()
        result = core.step(now)
        t1 = time.perf_counter_ns()
        deliver(streams, result, loop)
        hand_out_ns += time.perf_counter_ns() - t1
        step_ns += t1 - t0
        now = result.end
        tokens += len(result.outputs)
        await asyncio.sleep(0)  # the loop turns once a pass, as the live loop's does
    after = os.times()
    return {
        **_cpu(before, after, tokens),
        "pass_ns_per_token": step_ns / tokens,
        "hand_out_ns_per_token": hand_out_ns / tokens,
        "compiled_text_table": table is not None,
    }


async def _floor(transports: list[Any]) -> dict[str, float]:
    # A chunk of mocker's size (its head, an 8-letter word, its tail), framed once.
    body = (
        b'data: {"id":"cmpl-'
        + b"0" * 34
        + b'","object":"text_completion","created":'
        + str(int(time.time())).encode()
        + b',"model":"mocker","choices":[{"index":0,'
        b'"text":" baseline","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
    )
    framed = b"%x\r\n%b\r\n" % (len(body), body)
    writes = [t.write for t in transports]
    for _ in range(WARMUP_PASSES):
        for write in writes:
            write(framed)
    _serving_gc()
    tokens = 0
    before = os.times()
    for _ in range(PASSES):
        for write in writes:
            write(framed)
        tokens += len(writes)
        await asyncio.sleep(0)
    after = os.times()
    return _cpu(before, after, tokens)


def _serving_gc() -> None:
    """The collector as `mocker serve` runs it (mocker.api.gc_tuning)."""
    import gc

    from mocker.api.gc_tuning import MIDDLE_THRESHOLD, YOUNG_THRESHOLD

    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, *gc.get_threshold()[2:])


def _cpu(before: os.times_result, after: os.times_result, tokens: int) -> dict[str, float]:
    return {
        "tokens": tokens,
        "user_us_per_token": (after.user - before.user) / tokens * 1e6,
        "sys_us_per_token": (after.system - before.system) / tokens * 1e6,
        "wall_us_per_token": (after.elapsed - before.elapsed) / tokens * 1e6,
    }


def child(mode: str) -> int:
    """One run: the reader forked on the client's core, this process on the server's."""
    import uvloop

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound and listening before anyone connects
    listener.listen(STREAMS)
    port = listener.getsockname()[1]
    reader = os.fork()
    if reader == 0:
        try:
            _reader(listener, STREAMS)
        finally:
            os._exit(0)
    listener.close()
    pin(SERVER_CPU)

    async def run() -> dict[str, float]:
        transports = await _connections(port, STREAMS)
        try:
            return await (_mocker(transports) if mode == "mocker" else _floor(transports))
        finally:
            for transport in transports:
                transport.close()
            await asyncio.sleep(0.1)

    result = uvloop.run(run())
    os.waitpid(reader, 0)
    print(json.dumps(result), flush=True)
    return 0


def run_child(mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    log(
        f"  {mode:6s}: user {result['user_us_per_token']:.2f} + sys "
        f"{result['sys_us_per_token']:.2f} us/token, wall {result['wall_us_per_token']:.2f}"
        + (
            f" (pass {result['pass_ns_per_token']:.0f} ns, hand-out "
            f"{result['hand_out_ns_per_token']:.0f} ns)"
            if mode == "mocker"
            else ""
        )
    )
    return result


def main() -> int:
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"mocker": [], "floor": []}
    for i in range(ROUNDS):
        for mode in ("mocker", "floor") if i % 2 == 0 else ("floor", "mocker"):
            runs[mode].append(run_child(mode))

    def median(mode: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[mode]), 3)

    ratios = [
        f["wall_us_per_token"] / m["wall_us_per_token"]
        for m, f in zip(runs["mocker"], runs["floor"], strict=True)
    ]
    summary = {
        "streams": STREAMS,
        "passes": PASSES,
        "rounds": ROUNDS,
        "mocker": {
            key: median("mocker", key)
            for key in (
                "user_us_per_token",
                "sys_us_per_token",
                "wall_us_per_token",
                "pass_ns_per_token",
                "hand_out_ns_per_token",
            )
        },
        "floor": {
            key: median("floor", key)
            for key in ("user_us_per_token", "sys_us_per_token", "wall_us_per_token")
        },
        "compiled_text_table": all(r["compiled_text_table"] for r in runs["mocker"]),
        "ratio_tokens_per_s": round(statistics.median(ratios), 3),
        "ratio_runs": [round(r, 3) for r in ratios],
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": MACHINE,
    }
    log(f"mocker/floor token rate: {summary['ratio_tokens_per_s']} (runs {summary['ratio_runs']})")
    emit(summary)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2]))
    sys.exit(main())
