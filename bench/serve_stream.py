"""Streaming cost of `mocker serve` vs a bare SSE floor at 100/500/1000 streams, its ITL, and the
cost of publishing KV events (the same load with a ZMQ subscriber counting every event)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import orjson
import uvloop
from harness import (
    CLIENT_CPU,
    HOST,
    ROOT,
    SERVER_CPU,
    Server,
    cpu_seconds,
    free_port,
    log,
    percentile,
    rounded,
    running,
)

# Run from the repo root with no arguments: `.venv/bin/python bench/serve_stream.py`.
# Progress goes to stderr; the last stdout line is one JSON object. The machine has two
# shared, noisy cores: the server gets core 1 and this client core 0, so the client (raw
# asyncio protocol, uvloop, a few bytes.find per chunk) never competes with the server it
# measures. Compare ratios within one run, not absolute figures across runs.


STREAM_COUNTS = (100, 500, 1000)
PROMPT_LEN = 64  # distinct ids per client, so prefix-cache hits play no part
TPUT_SPEEDUP = 1000.0  # modelled pass time ~6 us: the server's own CPU is the limit
TPUT_MAX_TOKENS = 200
# Throughput runs read in >= 8 KB batches (SO_RCVLOWAT): one read per ~37 chunks keeps the
# client well under the server's per-chunk cost, which per-chunk reads did not for the floor.
# The whole stream (~44 KB) fits the socket buffer, so the server never waits on us.
TPUT_READ_BATCH = 8192
ITL_SPEEDUP = 1.0  # real time: the client should see the modelled inter-token gaps
ITL_MAX_TOKENS = 64

CONNECT_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 120.0
KV_SAMPLE_PERIOD_S = 0.2

TEXT_KEY = b'"text":"'
DATA_KEY = b"data: "


def model_decode_ms(kv_usage: float, speedup: float) -> float:
    """The engine's modelled decode pass time at this KV usage (its polynomial)."""
    u = kv_usage
    return (-25.74 * u * u + 54.01 * u + 5.74) / speedup


def mocker_argv(port: int, speedup: float) -> list[str]:
    return [
        sys.executable, "-m", "mocker", "serve",
        "--host", HOST, "--port", str(port),
        "--speedup-ratio", str(speedup),
        "--max-num-seqs", "1024",
        "--max-num-batched-tokens", "8192",
        "--num-gpu-blocks-override", "65536",
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip


def events_argv(port: int, speedup: float, sub_port: int) -> list[str]:
    """mocker publishing KV events to a subscriber bound on loopback (the engine connects)."""
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://{HOST}:{sub_port}"}
    return [*mocker_argv(port, speedup), "--kv-events-config", json.dumps(config)]


def baseline_argv(port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn",
        "--app-dir", str(ROOT / "bench"), "sse_baseline:app",
        "--host", HOST, "--port", str(port),
        "--loop", "uvloop", "--http", "httptools",
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip


def prompt_for(client: int) -> list[int]:
    # Distinct ids per client (max ~65k, inside any real vocabulary).
    base = 1000 + client * PROMPT_LEN
    return list(range(base, base + PROMPT_LEN))


def completion_request(port: int, client: int, max_tokens: int) -> bytes:
    body = orjson.dumps(
        {
            "model": "mocker",
            "prompt": prompt_for(client),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class StreamClient(asyncio.Protocol):
    """One streaming completion on a raw socket, parsing only what the benchmark needs.

    The body is chunked; each SSE event ends in "\\n\\n" and the chunk framing is "\\r\\n"
    only, so splitting the raw bytes on "\\n\\n" yields whole events (with a chunk-size line
    in front, which the key lookups skip). Every generated token is one " word" of
    lowercase letters, so the spaces in "text" count the tokens a chunk carries.
    """

    def __init__(self, request: bytes, closed: asyncio.Future[None], read_batch: int) -> None:
        self.request = request
        self.read_batch = read_batch
        self.closed = closed
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.status_ok: bool | None = None
        self.sent_at = 0.0
        self.done_at: float | None = None
        self.times: list[float] = []  # arrival of each token chunk
        self.tokens: list[int] = []  # tokens in each token chunk
        self.chunk_bytes = 0  # SSE bytes of the token chunks
        self.usage_tokens: int | None = None
        self.error: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but have its interface.
        self.transport = cast(asyncio.Transport, transport)
        if self.read_batch > 1:
            # The kernel reports the socket readable only once this many bytes are queued
            # (or at EOF), so one read carries many chunks instead of one.
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, self.read_batch)

    def send(self) -> None:
        assert self.transport is not None
        self.sent_at = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()  # one stamp per read: events read together arrived together
        if self.status_ok is None:
            self.status_ok = data.startswith(b"HTTP/1.1 200")
            if not self.status_ok:
                self.error = data[:300].decode(errors="replace")
        *events, self.buf = (self.buf + data).split(b"\n\n")
        for event in events:
            self._event(event, now)

    def _event(self, event: bytes, now: float) -> None:
        start = event.find(TEXT_KEY)
        if start >= 0:
            start += len(TEXT_KEY)
            self.times.append(now)
            self.tokens.append(event.count(b" ", start, event.find(b'"', start)))
            self.chunk_bytes += len(event) - event.find(DATA_KEY) + 2
        elif b'"usage":' in event:
            usage = orjson.loads(event[event.find(DATA_KEY) + len(DATA_KEY) :])["usage"]
            self.usage_tokens = int(usage["completion_tokens"])
        elif event.endswith(b"data: [DONE]"):
            self.done_at = now
        elif b'"error"' in event and self.error is None:
            self.error = event[event.find(DATA_KEY) :][:300].decode(errors="replace")

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.error is None:
            self.error = repr(exc)
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def ok(self) -> bool:
        return bool(self.status_ok) and self.done_at is not None and self.usage_tokens is not None


@dataclass(slots=True)
class Load:
    """What one batch of N concurrent streams measured."""

    streams: int
    window_s: float
    tokens: int  # from the usage chunks
    counted_tokens: int  # from the token chunks' text
    chunks: int
    multi_token_chunks: int
    max_chunk_tokens: int
    mean_chunk_bytes: float
    server_cpu: float  # fraction of one core over the window
    client_cpu: float
    failed: int
    errors: list[str] = field(default_factory=list)
    log_issues: list[str] = field(default_factory=list)  # filled in once the server stops
    ttfts_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    decode_gaps_ms: list[float] = field(default_factory=list)  # after every stream's first token

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.window_s

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.window_s

    @property
    def tokens_per_chunk(self) -> float:
        return self.counted_tokens / max(1, self.chunks)


async def run_load(
    port: int, server_pid: int, n: int, max_tokens: int, read_batch: int = 0
) -> Load:
    """N streams connected first, then sent together; the window ends at the last [DONE]."""
    loop = asyncio.get_running_loop()
    clients = [
        StreamClient(completion_request(port, i, max_tokens), loop.create_future(), read_batch)
        for i in range(n)
    ]
    try:
        # Connect everyone before the window so all requests leave within a millisecond or so.
        await asyncio.wait_for(
            asyncio.gather(*(loop.create_connection(lambda c=c: c, HOST, port) for c in clients)),
            CONNECT_TIMEOUT_S,
        )
        cpu0, mine0 = cpu_seconds(server_pid), time.process_time()
        start = time.perf_counter()
        for c in clients:
            c.send()
        await asyncio.wait_for(asyncio.gather(*(c.closed for c in clients)), RUN_TIMEOUT_S)
        end = max([c.done_at for c in clients if c.done_at is not None], default=0.0)
        cpu1, mine1 = cpu_seconds(server_pid), time.process_time()
    finally:
        for c in clients:
            if c.transport is not None and not c.transport.is_closing():
                c.transport.abort()
    if end <= start:
        raise RuntimeError(f"no stream finished; first error: {clients[0].error}")
    window = end - start
    chunk_tokens = [t for c in clients for t in c.tokens]
    # Once every stream has its first token no prefill shares a pass: pure decode gaps.
    all_started = max((c.times[0] for c in clients if c.times), default=end)
    return Load(
        streams=n,
        window_s=window,
        tokens=sum(c.usage_tokens or 0 for c in clients),
        counted_tokens=sum(chunk_tokens),
        chunks=len(chunk_tokens),
        multi_token_chunks=sum(1 for t in chunk_tokens if t > 1),
        max_chunk_tokens=max(chunk_tokens, default=0),
        mean_chunk_bytes=sum(c.chunk_bytes for c in clients) / max(1, len(chunk_tokens)),
        server_cpu=(cpu1 - cpu0) / window,
        client_cpu=(mine1 - mine0) / window,
        failed=sum(1 for c in clients if not c.ok),
        errors=sorted({c.error for c in clients if c.error is not None})[:3],
        ttfts_ms=[(c.times[0] - c.sent_at) * 1000 for c in clients if c.times],
        # The first chunk is TTFT; gaps are between consecutive token chunks of one stream.
        gaps_ms=[(b - a) * 1000 for c in clients for a, b in pairwise(c.times)],
        decode_gaps_ms=[
            (b - a) * 1000 for c in clients for a, b in pairwise(c.times) if a >= all_started
        ],
    )


# -- metrics scraping -------------------------------------------------------------------------


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def metric(text: str, name: str) -> float:
    """Sum of a metric's samples over all label sets."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def sample_kv_usage(port: int, samples: list[float]) -> None:
    """KV usage while every request is decoding (none waiting), until cancelled."""
    while True:
        await asyncio.sleep(KV_SAMPLE_PERIOD_S)
        with contextlib.suppress(OSError):
            text = await asyncio.to_thread(scrape, port)
            running_now = metric(text, "vllm:num_requests_running")
            if running_now > 0 and metric(text, "vllm:num_requests_waiting") == 0:
                samples.append(metric(text, "vllm:kv_cache_usage_perc"))


async def run_itl(port: int, server_pid: int, n: int) -> dict[str, Any]:
    before = await asyncio.to_thread(scrape, port)
    kv: list[float] = []
    sampler = asyncio.get_running_loop().create_task(sample_kv_usage(port, kv))
    try:
        load = await run_load(port, server_pid, n, ITL_MAX_TOKENS)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    after = await asyncio.to_thread(scrape, port)
    itl_sum = metric(after, "vllm:inter_token_latency_seconds_sum") - metric(
        before, "vllm:inter_token_latency_seconds_sum"
    )
    itl_count = metric(after, "vllm:inter_token_latency_seconds_count") - metric(
        before, "vllm:inter_token_latency_seconds_count"
    )
    kv_mean = sum(kv) / len(kv) if kv else None
    return {
        "load": load,
        "model_itl_ms": itl_sum / itl_count * 1000 if itl_count else None,
        "kv_usage": kv_mean,
        "formula_itl_ms": None if kv_mean is None else model_decode_ms(kv_mean, ITL_SPEEDUP),
    }


# -- the cases --------------------------------------------------------------------------------


def collect_log_issues(name: str, server: Server, load: Load) -> None:
    """Keep the stopped server's suspicious log lines with the load, and say so."""
    load.log_issues = server.log_issues()
    if load.log_issues:
        log(f"  {name} log: {len(load.log_issues)} suspicious lines: {load.log_issues[0]}")


def throughput(name: str, argv_for: Callable[[int], list[str]], n: int, logs: Path) -> Load:
    with running(name, argv_for, logs) as server:
        load = uvloop.run(
            run_load(server.port, server.proc.pid, n, TPUT_MAX_TOKENS, TPUT_READ_BATCH)
        )
    log(
        f"  {name:8s} N={n:4d}: {load.tokens_per_s:9.0f} tok/s  {load.chunks_per_s:9.0f} chunks/s"
        f"  server cpu {load.server_cpu:.2f}  client cpu {load.client_cpu:.2f}"
        f"  window {load.window_s:.2f}s  tokens/chunk {load.tokens_per_chunk:.2f}"
        f" (max {load.max_chunk_tokens})  failed {load.failed}"
    )
    collect_log_issues(name, server, load)
    return load


@contextlib.contextmanager
def kv_subscriber(port: int) -> Any:
    """bench/kv_subscriber.py on the client's core (inherited affinity); yields a dict that is
    filled with its counts once it has stopped."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "kv_subscriber.py"), str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts: dict[str, Any] = {}
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield counts
    finally:
        out, _ = proc.communicate(input="", timeout=30)  # stdin EOF: print the counts, exit
        lines = out.strip().splitlines()
        if lines:
            counts.update(json.loads(lines[-1]))


def throughput_with_events(n: int, logs: Path) -> tuple[Load, dict[str, Any]]:
    sub_port = free_port()
    with kv_subscriber(sub_port) as counts:
        load = throughput("events", lambda p: events_argv(p, TPUT_SPEEDUP, sub_port), n, logs)
    if not counts.get("batches"):
        raise RuntimeError(f"the subscriber received no KV events: {counts}")
    log(
        f"  events   N={n:4d}: {counts['events'] / load.window_s:9.0f} events/s"
        f"  {counts['batches'] / load.window_s:7.0f} batches/s"
        f"  {counts['stored_blocks']} blocks stored, sequence gaps {counts['gaps']}"
    )
    return load, counts


# Publishing cost: mocker with and without a KV-event subscriber, in pairs (the order swapped
# every pair) at one load, because single runs on this machine vary by +-15% or more.
EVENTS_STREAMS = 300
EVENTS_PAIRS = 6


def events_cost(logs: Path) -> dict[str, Any]:
    ratios: list[float] = []
    plain_tps: list[float] = []
    events_tps: list[float] = []
    rates: list[float] = []
    batch_rates: list[float] = []
    gaps = stored = 0
    n = EVENTS_STREAMS

    def plain() -> Load:
        return throughput("mocker", lambda p: mocker_argv(p, TPUT_SPEEDUP), n, logs)

    for i in range(EVENTS_PAIRS):
        if i % 2:
            published, counts = throughput_with_events(n, logs)
            base = plain()
        else:
            base = plain()
            published, counts = throughput_with_events(n, logs)
        ratios.append(published.tokens_per_s / base.tokens_per_s)
        plain_tps.append(base.tokens_per_s)
        events_tps.append(published.tokens_per_s)
        rates.append(counts["events"] / published.window_s)
        batch_rates.append(counts["batches"] / published.window_s)
        gaps += counts["gaps"] + published.failed + base.failed
        stored += counts["stored_blocks"]
    result = {
        "streams": EVENTS_STREAMS,
        "pairs": EVENTS_PAIRS,
        # Streaming throughput kept while publishing, median over pairs (target >= 0.9).
        "ratio_median": rounded(statistics.median(ratios)),
        "ratios": [round(r, 3) for r in ratios],
        "tokens_per_s_median": round(statistics.median(plain_tps)),
        "events_tokens_per_s_median": round(statistics.median(events_tps)),
        "events_per_s_median": round(statistics.median(rates)),
        "batches_per_s_median": round(statistics.median(batch_rates)),
        "stored_blocks": stored,
        "sequence_gaps_or_failed_streams": gaps,
    }
    log(f"events cost: ratio median {result['ratio_median']} over {result['ratios']}")
    return result


CEILING_BATCHES = 20_000
CEILING_EVENTS_PER_BATCH = 50  # one 16-token block each, as a pass of 50 requests stores


def publisher_ceiling() -> dict[str, Any]:
    """The publisher alone, on the server's core: batches published back to back to a
    subscriber on the client's core. Gives the engine-side cost of one publish() and the
    events per second that reach a subscriber intact."""
    from mocker.kv.events import BlockStored
    from mocker.kvevents.config import KVEventsConfig
    from mocker.kvevents.publisher import ZmqEventPublisher

    sub_port = free_port()
    batch = [
        BlockStored((2**63 + i,), 2**62 + i, tuple(range(i, i + 16)), 16)
        for i in range(CEILING_EVENTS_PER_BATCH)
    ]
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://{HOST}:{sub_port}")
    with kv_subscriber(sub_port) as counts:
        os.sched_setaffinity(0, {SERVER_CPU})  # the publisher thread inherits this core
        try:
            # Its first batch (AllBlocksCleared) waits for the subscription, so none is lost.
            publisher = ZmqEventPublisher(config)
            start = time.perf_counter()
            for _ in range(CEILING_BATCHES):
                publisher.publish(batch)
            publish_s = time.perf_counter() - start
            publisher.close(timeout=60)
        finally:
            os.sched_setaffinity(0, {CLIENT_CPU})
        time.sleep(0.5)  # the subscriber drains its socket before it is told to stop
    received = counts["events"]
    span = max(1e-9, counts["last_at"] - counts["first_at"])
    result = {
        "publish_us": round(publish_s / CEILING_BATCHES * 1e6, 2),
        "events_sent": CEILING_BATCHES * CEILING_EVENTS_PER_BATCH + 1,  # + AllBlocksCleared
        "events_received": received,
        "events_per_s": round(received / span),
        "sequence_gaps": counts["gaps"],
    }
    log(
        f"publisher alone: {result['publish_us']} us per publish() of {len(batch)} events;"
        f" {result['events_per_s']} events/s received, {received}/{result['events_sent']}"
        f" events, {counts['gaps']} gaps"
    )
    return result


def itl(n: int, logs: Path) -> dict[str, Any]:
    with running("mocker-itl", lambda p: mocker_argv(p, ITL_SPEEDUP), logs) as server:
        result = uvloop.run(run_itl(server.port, server.proc.pid, n))
    load: Load = result["load"]
    p50, p99 = percentile(load.gaps_ms, 0.5) or 0.0, percentile(load.gaps_ms, 0.99) or 0.0
    log(
        f"  itl      N={n:4d}: client gap p50 {p50:.2f} ms p99 {p99:.2f} ms"
        f" (decode-only p50 {percentile(load.decode_gaps_ms, 0.5) or 0:.2f}"
        f" p99 {percentile(load.decode_gaps_ms, 0.99) or 0:.2f})"
        f"  model {result['model_itl_ms'] or 0:.2f} ms"
        f"  formula {result['formula_itl_ms'] or 0:.2f} ms (kv {result['kv_usage'] or 0:.3f})"
        f"  ttft p50 {percentile(load.ttfts_ms, 0.5) or 0:.1f} ms"
        f"  server cpu {load.server_cpu:.2f}  tokens/chunk {load.tokens_per_chunk:.2f}"
        f" (max {load.max_chunk_tokens})  failed {load.failed}"
    )
    collect_log_issues("itl", server, load)
    return result


def attempt(row: dict[str, Any], label: str, fn: Callable[[], Any]) -> Any:
    """Run one case; a failure is recorded in the row instead of ending the benchmark."""
    try:
        return fn()
    except Exception as exc:
        log(f"  {label} N={row['streams']} FAILED: {exc!r}")
        row.setdefault("errors", []).append(f"{label}: {exc!r}"[:500])
        return None


def row_for(n: int, logs: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"streams": n}
    mocker = attempt(
        row, "mocker", lambda: throughput("mocker", lambda p: mocker_argv(p, TPUT_SPEEDUP), n, logs)
    )
    base = attempt(row, "baseline", lambda: throughput("baseline", baseline_argv, n, logs))
    fidelity = attempt(row, "itl", lambda: itl(n, logs))
    if mocker is not None:
        row.update(
            tokens_per_s=round(mocker.tokens_per_s),
            server_cpu=round(mocker.server_cpu, 3),
            chunks_per_s=round(mocker.chunks_per_s),
            tokens_per_chunk=round(mocker.tokens_per_chunk, 2),
            multi_token_chunk_frac=round(mocker.multi_token_chunks / max(1, mocker.chunks), 3),
            max_tokens_per_chunk=mocker.max_chunk_tokens,
            chunk_bytes=round(mocker.mean_chunk_bytes, 1),
            client_cpu=round(mocker.client_cpu, 3),
            window_s=round(mocker.window_s, 3),
            failed_streams=mocker.failed,
            token_count_check=mocker.tokens == mocker.counted_tokens,
        )
        if mocker.errors:
            row["stream_errors"] = mocker.errors
        if mocker.log_issues:
            row["server_log_issues"] = mocker.log_issues[:3]
    if base is not None:
        row.update(
            baseline_tokens_per_s=round(base.tokens_per_s),
            baseline_cpu=round(base.server_cpu, 3),
            baseline_chunk_bytes=round(base.mean_chunk_bytes, 1),
            baseline_client_cpu=round(base.client_cpu, 3),
            baseline_failed_streams=base.failed,
        )
        if base.log_issues:
            row["baseline_log_issues"] = base.log_issues[:3]
    if mocker is not None and base is not None:
        row["ratio"] = round(mocker.tokens_per_s / base.tokens_per_s, 3)
        # Mocker may merge several tokens into one chunk when streams lag; the floor never does.
        row["chunk_ratio"] = round(mocker.chunks_per_s / base.chunks_per_s, 3)
    if fidelity is not None:
        load = fidelity["load"]
        row.update(
            itl_p50_ms=rounded(percentile(load.gaps_ms, 0.5)),
            itl_p99_ms=rounded(percentile(load.gaps_ms, 0.99)),
            itl_decode_p50_ms=rounded(percentile(load.decode_gaps_ms, 0.5)),
            itl_decode_p99_ms=rounded(percentile(load.decode_gaps_ms, 0.99)),
            model_itl_ms=rounded(fidelity["model_itl_ms"]),
            formula_itl_ms=rounded(fidelity["formula_itl_ms"]),
            itl_kv_usage=rounded(fidelity["kv_usage"], 4),
            ttft_p50_ms=rounded(percentile(load.ttfts_ms, 0.5)),
            itl_tokens_per_chunk=round(load.tokens_per_chunk, 3),
            itl_max_tokens_per_chunk=load.max_chunk_tokens,
            itl_server_cpu=round(load.server_cpu, 3),
            itl_client_cpu=round(load.client_cpu, 3),
            itl_window_s=round(load.window_s, 3),
            itl_failed_streams=load.failed,
        )
        if load.errors:
            row["itl_stream_errors"] = load.errors
        if load.log_issues:
            row["itl_server_log_issues"] = load.log_issues[:3]
    return row


def main() -> int:
    os.sched_setaffinity(0, {CLIENT_CPU})
    started = time.perf_counter()
    logs = Path(tempfile.mkdtemp(prefix="serve_stream-"))
    log(f"server logs in {logs}; server on cpu {SERVER_CPU}, client on cpu {CLIENT_CPU}")
    rows = []
    for n in STREAM_COUNTS:
        log(f"N = {n} streams")
        rows.append(row_for(n, logs))
    log(f"KV events: {EVENTS_PAIRS} pairs at N = {EVENTS_STREAMS}")
    cost = events_cost(logs)
    ceiling = publisher_ceiling()
    wall = time.perf_counter() - started
    log(f"done in {wall:.1f}s")
    summary = {
        "runs": rows,
        "kv_events": {**cost, "publisher_alone": ceiling},
        "throughput_speedup": TPUT_SPEEDUP,
        "throughput_max_tokens": TPUT_MAX_TOKENS,
        "itl_speedup": ITL_SPEEDUP,
        "itl_max_tokens": ITL_MAX_TOKENS,
        "prompt_len": PROMPT_LEN,
        "wall_s": round(wall, 1),
        "machine": "2 shared, noisy cores: server on cpu 1, client on cpu 0; compare ratios",
        "logs": str(logs),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
