"""Streaming cost of `mocker serve` vs a bare SSE floor at 100/500/1000 streams, its ITL, the
cost of publishing KV events (the same load with a ZMQ subscriber counting every event), and
the token rate with --stream-interval 10 against 1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import uvloop
from harness import (
    CLIENT_CPU,
    HOST,
    MACHINE,
    ROOT,
    SERVER_CPU,
    Server,
    Wanted,
    attempt,
    client_setup,
    counters,
    cpu_split,
    deltas,
    emit,
    log,
    metric,
    mocker_argv,
    percentile,
    pin,
    rounded,
    running,
    scrape,
)
from sse_client import SseConnection, Stream, completion_body, completion_request

# Run from the repo root with no arguments: `.venv/bin/python bench/serve_stream.py`.
# Progress goes to stderr; the last stdout line is one JSON object. The machine has two
# shared, noisy cores: the server gets core 1 and this client core 0, so the client (raw
# asyncio protocol, uvloop, a few bytes.find per chunk) never competes with the server it
# measures. Compare ratios within one run, not absolute figures across runs.


STREAM_COUNTS = (100, 500, 1000)
PROMPT_LEN = 64  # distinct ids per client, so prefix-cache hits play no part
TPUT_SPEEDUP = 1000.0  # modelled pass time ~6 us: the server's own CPU is the limit
TPUT_MAX_TOKENS = 200
TPUT_ROUNDS = 3  # mocker and the floor alternately, per stream count: medians and the spread
# Throughput runs read in >= 8 KB batches (SO_RCVLOWAT): one read per ~37 chunks keeps the
# client well under the server's per-chunk cost, which per-chunk reads did not for the floor.
# The whole stream (~44 KB) fits the socket buffer, so the server never waits on us.
TPUT_READ_BATCH = 8192
ITL_SPEEDUP = 1.0  # real time: the client should see the modelled inter-token gaps
ITL_MAX_TOKENS = 64
# Stream counts whose ITL run is repeated with --max-merged-passes (a server that cannot keep
# up streams several passes' tokens per chunk; its passes keep the modelled pace), and N.
MERGED_FROM_STREAMS = 500
MERGED_PASSES = 32

CONNECT_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 120.0
KV_SAMPLE_PERIOD_S = 0.2
ITL_METRICS: Wanted = {
    "sum": ("vllm:inter_token_latency_seconds_sum", {}),
    "count": ("vllm:inter_token_latency_seconds_count", {}),
}


def model_decode_ms(kv_usage: float, speedup: float) -> float:
    """The engine's modelled decode pass time at this KV usage (its polynomial)."""
    u = kv_usage
    return (-25.74 * u * u + 54.01 * u + 5.74) / speedup


def serve_argv(speedup: float) -> list[str]:
    return mocker_argv(
        speedup,
        "--max-num-seqs", "1024",
        "--max-num-batched-tokens", "8192",
        "--num-gpu-blocks-override", "65536",
    )  # fmt: skip


def events_argv(speedup: float, endpoint: str) -> list[str]:
    """mocker publishing KV events to a subscriber bound on loopback (the engine connects)."""
    config = {"enable_kv_cache_events": True, "endpoint": endpoint}
    return [*serve_argv(speedup), "--kv-events-config", json.dumps(config)]


# The bare floor: bench/sse_baseline.py binds a free port and names it, as mocker does.
BASELINE_ARGV = [sys.executable, str(ROOT / "bench" / "sse_baseline.py")]


def prompt_for(client: int) -> list[int]:
    # Distinct ids per client (max ~65k, inside any real vocabulary).
    base = 1000 + client * PROMPT_LEN
    return list(range(base, base + PROMPT_LEN))


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
    server_user_s: float  # of which in its own code
    server_sys_s: float  # and in the kernel (the socket writes)
    client_cpu: float
    failed: int
    errors: list[str] = field(default_factory=list)
    log_issues: list[str] = field(default_factory=list)  # filled in once the server stops
    ttfts_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    decode_gaps_ms: list[float] = field(default_factory=list)  # after every stream's first token
    # Per stream, once every stream has its first token: ms from its first chunk to its last,
    # per token after the first chunk (a chunk may carry several).
    decode_ms_per_token: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.window_s

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.window_s

    @property
    def user_us_per_token(self) -> float:
        return self.server_user_s / max(1, self.tokens) * 1e6

    @property
    def sys_us_per_token(self) -> float:
        return self.server_sys_s / max(1, self.tokens) * 1e6

    @property
    def tokens_per_chunk(self) -> float:
        return self.counted_tokens / max(1, self.chunks)


async def run_load(
    port: int, server_pid: int, n: int, max_tokens: int, read_batch: int = 0
) -> Load:
    """N streams connected first, then sent together; the window ends at the last [DONE]."""
    loop = asyncio.get_running_loop()
    requests = [
        completion_request(HOST, port, completion_body(prompt_for(i), max_tokens)) for i in range(n)
    ]
    conns = [SseConnection(read_batch) for _ in range(n)]
    try:
        # Connect everyone before the window so all requests leave within a millisecond or so.
        await asyncio.wait_for(
            asyncio.gather(*(loop.create_connection(lambda c=c: c, HOST, port) for c in conns)),
            CONNECT_TIMEOUT_S,
        )
        (user0, sys0), mine0 = cpu_split(server_pid), time.process_time()
        start = time.perf_counter()
        clients = [c.send(request) for c, request in zip(conns, requests, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(c.ended for c in conns)), RUN_TIMEOUT_S)
        end = max([c.done_at for c in clients if c.done_at is not None], default=0.0)
        (user1, sys1), mine1 = cpu_split(server_pid), time.process_time()
    finally:
        for c in conns:
            c.abort()
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
        server_cpu=(user1 - user0 + sys1 - sys0) / window,
        server_user_s=user1 - user0,
        server_sys_s=sys1 - sys0,
        client_cpu=(mine1 - mine0) / window,
        failed=sum(1 for c in clients if not c.ok),
        errors=sorted({c.error for c in clients if c.error is not None})[:3],
        ttfts_ms=[(c.times[0] - c.sent_at) * 1000 for c in clients if c.times],
        # The first chunk is TTFT; gaps are between consecutive token chunks of one stream.
        gaps_ms=[(b - a) * 1000 for c in clients for a, b in pairwise(c.times)],
        decode_gaps_ms=[
            (b - a) * 1000 for c in clients for a, b in pairwise(c.times) if a >= all_started
        ],
        decode_ms_per_token=[rate for c in clients if (rate := _decode_rate(c, all_started))],
    )


def _decode_rate(stream: Stream, all_started: float) -> float | None:
    """ms per token of a stream's chunks from `all_started` on (None: too few of them)."""
    late = [(t, k) for t, k in zip(stream.times, stream.tokens, strict=True) if t >= all_started]
    if len(late) < 3:
        return None
    return (late[-1][0] - late[0][0]) * 1000 / sum(k for _, k in late[1:])


# -- /metrics during a run ---------------------------------------------------------------------


async def sample_kv_usage(port: int, samples: list[float], stop: asyncio.Event) -> None:
    """KV usage while every request is decoding (none waiting), until `stop` is set. Read on
    this event loop: a blocking scrape in a thread (urllib) held the GIL for milliseconds, and
    the streams read late showed it as gaps (a stall at each sample in the ITL run's p99).
    (Stopped by an event, not by cancelling alone: 3.11's wait_for can swallow a cancellation
    that lands as the scrape's read completes, and the task then sampled forever.)"""
    while not stop.is_set():
        await asyncio.sleep(KV_SAMPLE_PERIOD_S)
        with contextlib.suppress(OSError):
            text = (await scrape_bytes(port)).decode()
            running_now = metric(text, "vllm:num_requests_running")
            if running_now > 0 and metric(text, "vllm:num_requests_waiting") == 0:
                samples.append(metric(text, "vllm:kv_cache_usage_perc"))


async def scrape_bytes(port: int) -> bytes:
    """GET /metrics on a fresh connection, without leaving the event loop."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        request = f"GET /metrics HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        return await asyncio.wait_for(reader.read(), CONNECT_TIMEOUT_S)
    finally:
        writer.close()


async def run_itl(port: int, server_pid: int, n: int) -> dict[str, Any]:
    before = counters(await asyncio.to_thread(scrape, port), ITL_METRICS)
    kv: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.get_running_loop().create_task(sample_kv_usage(port, kv, stop))
    try:
        load = await run_load(port, server_pid, n, ITL_MAX_TOKENS)
    finally:
        stop.set()
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    itl = deltas(counters(await asyncio.to_thread(scrape, port), ITL_METRICS), before)
    kv_mean = sum(kv) / len(kv) if kv else None
    return {
        "load": load,
        "model_itl_ms": itl["sum"] / itl["count"] * 1000 if itl["count"] else None,
        "kv_usage": kv_mean,
        "formula_itl_ms": None if kv_mean is None else model_decode_ms(kv_mean, ITL_SPEEDUP),
    }


# -- the cases --------------------------------------------------------------------------------


def collect_log_issues(name: str, server: Server, load: Load) -> None:
    """Keep the stopped server's suspicious log lines with the load, and say so."""
    load.log_issues = server.log_issues()
    if load.log_issues:
        log(f"  {name} log: {len(load.log_issues)} suspicious lines: {load.log_issues[0]}")


def throughput(name: str, argv: list[str], n: int, logs: Path) -> Load:
    with running(name, argv, logs) as server:
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


@dataclass(slots=True)
class Subscriber:
    """A running bench/kv_subscriber.py: the endpoint it bound, and its counts once stopped."""

    endpoint: str
    counts: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def kv_subscriber() -> Iterator[Subscriber]:
    """bench/kv_subscriber.py on the client's core (inherited affinity). It binds a free port
    and names the endpoint before anyone connects; its counts are filled in once it stops."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "kv_subscriber.py")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        ready, _, endpoint = proc.stdout.readline().strip().partition(" ")
        if ready != "ready" or not endpoint:
            raise RuntimeError(f"kv_subscriber.py did not start (said {ready!r} {endpoint!r})")
        yield Subscriber(endpoint, counts)
    finally:
        out, _ = proc.communicate(input="", timeout=30)  # stdin EOF: print the counts, exit
        lines = out.strip().splitlines()
        if lines:
            counts.update(json.loads(lines[-1]))


def throughput_with_events(n: int, logs: Path) -> tuple[Load, dict[str, Any]]:
    with kv_subscriber() as sub:
        load = throughput("events", events_argv(TPUT_SPEEDUP, sub.endpoint), n, logs)
    counts = sub.counts
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
        return throughput("mocker", serve_argv(TPUT_SPEEDUP), n, logs)

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


INTERVAL_STREAMS = 500
INTERVAL = 10  # --stream-interval against 1, same load, alternating
INTERVAL_ROUNDS = 3


def stream_interval_cost(logs: Path, errors: list[str]) -> dict[str, Any]:
    """The same throughput load with --stream-interval INTERVAL and with 1, alternating: the
    server's token rate and CPU per token when a chunk carries INTERVAL tokens (vLLM's
    output processor's rule: the first token alone, then INTERVAL a chunk)."""
    runs: dict[int, list[Load]] = {1: [], INTERVAL: []}
    for i in range(INTERVAL_ROUNDS):
        for interval in (1, INTERVAL) if i % 2 == 0 else (INTERVAL, 1):
            argv = [*serve_argv(TPUT_SPEEDUP), "--stream-interval", str(interval)]
            load = attempt(errors, f"interval {interval} round {i}",
                           lambda a=argv, k=interval: throughput(f"si{k}", a, INTERVAL_STREAMS,
                                                                 logs))  # fmt: skip
            if load is not None:
                runs[interval].append(load)
    out: dict[str, Any] = {"streams": INTERVAL_STREAMS, "interval": INTERVAL}
    for interval, loads in runs.items():
        if not loads:
            continue
        out[f"interval_{interval}"] = {
            "tokens_per_s": round(median_of(loads, lambda r: r.tokens_per_s)),
            "tokens_per_s_runs": [round(r.tokens_per_s) for r in loads],
            "server_user_us_per_token": round(median_of(loads, lambda r: r.user_us_per_token), 2),
            "server_sys_us_per_token": round(median_of(loads, lambda r: r.sys_us_per_token), 2),
            "tokens_per_chunk": round(median_of(loads, lambda r: r.tokens_per_chunk), 2),
        }
    if runs[1] and runs[INTERVAL]:
        out["ratio"] = round(
            out[f"interval_{INTERVAL}"]["tokens_per_s"] / out["interval_1"]["tokens_per_s"], 2
        )
    return out


CEILING_BATCHES = 20_000
CEILING_EVENTS_PER_BATCH = 50  # one 16-token block each, as a pass of 50 requests stores


def publisher_ceiling() -> dict[str, Any]:
    """The publisher alone, on the server's core: batches published back to back to a
    subscriber on the client's core. Gives the engine-side cost of one publish() and the
    events per second that reach a subscriber intact."""
    from mocker.kv.events import BlockStored
    from mocker.kvevents.config import KVEventsConfig
    from mocker.kvevents.publisher import ZmqEventPublisher

    batch = [
        BlockStored((2**63 + i,), 2**62 + i, tuple(range(i, i + 16)), 16)
        for i in range(CEILING_EVENTS_PER_BATCH)
    ]
    with kv_subscriber() as sub:
        config = KVEventsConfig(enable_kv_cache_events=True, endpoint=sub.endpoint)
        pin(SERVER_CPU)  # the publisher thread inherits this core
        try:
            # Its first batch (AllBlocksCleared) waits for the subscription, so none is lost.
            publisher = ZmqEventPublisher(config)
            start = time.perf_counter()
            for _ in range(CEILING_BATCHES):
                publisher.publish(batch)
            publish_s = time.perf_counter() - start
            publisher.close(timeout=60)
        finally:
            pin(CLIENT_CPU)
        time.sleep(3.0)  # the subscriber drains its socket before it is told to stop (a slow
        # machine needed more than the 0.5 s this once was: 63% of the events counted)
    counts = sub.counts
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


def itl(n: int, logs: Path, merged: int = 1) -> dict[str, Any]:
    argv = serve_argv(ITL_SPEEDUP) + (["--max-merged-passes", str(merged)] if merged > 1 else [])
    with running("mocker-itl", argv, logs) as server:
        result = uvloop.run(run_itl(server.port, server.proc.pid, n))
    load: Load = result["load"]
    p50, p99 = percentile(load.gaps_ms, 0.5) or 0.0, percentile(load.gaps_ms, 0.99) or 0.0
    log(
        f"  itl{'+merge' if merged > 1 else '      '} N={n:4d}: client gap p50 {p50:.2f} ms"
        f" p99 {p99:.2f} ms  decode ms/token p50"
        f" {percentile(load.decode_ms_per_token, 0.5) or 0:.2f}"
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


def alternating(n: int, logs: Path, errors: list[str]) -> list[tuple[Load | None, Load | None]]:
    """TPUT_ROUNDS rounds of one throughput run of mocker and one of the floor, back to back
    (who goes first swaps every round), so that a slow spell of this shared machine hits both
    alike. Per round (mocker, floor); a run that failed is None (and named in `errors`)."""
    rounds: list[tuple[Load | None, Load | None]] = []
    for i in range(TPUT_ROUNDS):
        got: dict[str, Load | None] = {}
        for name in ("mocker", "baseline") if i % 2 == 0 else ("baseline", "mocker"):
            argv = serve_argv(TPUT_SPEEDUP) if name == "mocker" else BASELINE_ARGV
            got[name] = attempt(
                errors, f"{name} round {i}", lambda a=argv, m=name: throughput(m, a, n, logs)
            )
        rounds.append((got["mocker"], got["baseline"]))
    return rounds


def median_of(loads: list[Load], key: Callable[[Load], float]) -> float:
    return statistics.median(key(load) for load in loads)


def row_for(n: int, logs: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"streams": n}
    errors: list[str] = []
    rounds = alternating(n, logs, errors)
    ours = [m for m, _ in rounds if m is not None]
    floor = [b for _, b in rounds if b is not None]
    # Pairs only of runs that went back to back (a round with a failed run drops out).
    pairs = [(m, b) for m, b in rounds if m is not None and b is not None]
    fidelity = attempt(errors, "itl", lambda: itl(n, logs))
    merged = None
    if n >= MERGED_FROM_STREAMS:
        merged = attempt(errors, "itl merged", lambda: itl(n, logs, MERGED_PASSES))
    if errors:
        row["errors"] = errors
    if ours:
        chunks = sum(r.chunks for r in ours)
        row.update(
            tokens_per_s=round(median_of(ours, lambda r: r.tokens_per_s)),
            tokens_per_s_runs=[round(r.tokens_per_s) for r in ours],
            server_cpu=round(median_of(ours, lambda r: r.server_cpu), 3),
            server_user_us_per_token=round(median_of(ours, lambda r: r.user_us_per_token), 2),
            server_sys_us_per_token=round(median_of(ours, lambda r: r.sys_us_per_token), 2),
            chunks_per_s=round(median_of(ours, lambda r: r.chunks_per_s)),
            tokens_per_chunk=round(sum(r.counted_tokens for r in ours) / max(1, chunks), 2),
            multi_token_chunk_frac=round(
                sum(r.multi_token_chunks for r in ours) / max(1, chunks), 3
            ),
            max_tokens_per_chunk=max(r.max_chunk_tokens for r in ours),
            chunk_bytes=round(sum(r.mean_chunk_bytes * r.chunks for r in ours) / max(1, chunks), 1),
            client_cpu=round(median_of(ours, lambda r: r.client_cpu), 3),
            window_s=round(median_of(ours, lambda r: r.window_s), 3),
            failed_streams=sum(r.failed for r in ours),
            token_count_check=all(r.tokens == r.counted_tokens for r in ours),
        )
        stream_errors = [e for r in ours for e in r.errors]
        if stream_errors:
            row["stream_errors"] = stream_errors[:3]
        log_issues = [line for r in ours for line in r.log_issues]
        if log_issues:
            row["server_log_issues"] = log_issues[:3]
    if floor:
        row.update(
            baseline_tokens_per_s=round(median_of(floor, lambda r: r.tokens_per_s)),
            baseline_tokens_per_s_runs=[round(r.tokens_per_s) for r in floor],
            baseline_cpu=round(median_of(floor, lambda r: r.server_cpu), 3),
            baseline_user_us_per_token=round(median_of(floor, lambda r: r.user_us_per_token), 2),
            baseline_sys_us_per_token=round(median_of(floor, lambda r: r.sys_us_per_token), 2),
            baseline_chunk_bytes=round(median_of(floor, lambda r: r.mean_chunk_bytes), 1),
            baseline_client_cpu=round(median_of(floor, lambda r: r.client_cpu), 3),
            baseline_failed_streams=sum(r.failed for r in floor),
        )
        log_issues = [line for r in floor for line in r.log_issues]
        if log_issues:
            row["baseline_log_issues"] = log_issues[:3]
    if pairs:
        # Per round (the two ran back to back), then the median: the spread says how noisy.
        ratios = [m.tokens_per_s / b.tokens_per_s for m, b in pairs]
        row["ratio"] = round(statistics.median(ratios), 3)
        row["ratio_runs"] = [round(r, 3) for r in ratios]
        # Mocker may merge several tokens into one chunk when streams lag; the floor never does.
        row["chunk_ratio"] = round(
            statistics.median(m.chunks_per_s / b.chunks_per_s for m, b in pairs), 3
        )
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
            itl_decode_ms_per_token_p50=rounded(percentile(load.decode_ms_per_token, 0.5)),
        )
        if load.errors:
            row["itl_stream_errors"] = load.errors
        if load.log_issues:
            row["itl_server_log_issues"] = load.log_issues[:3]
    if merged is not None:
        load = merged["load"]
        row["merged"] = {
            "max_merged_passes": MERGED_PASSES,
            "decode_ms_per_token_p50": rounded(percentile(load.decode_ms_per_token, 0.5)),
            "formula_itl_ms": rounded(merged["formula_itl_ms"]),
            "model_itl_ms": rounded(merged["model_itl_ms"]),
            "chunk_gap_p50_ms": rounded(percentile(load.decode_gaps_ms, 0.5)),
            "chunk_gap_p99_ms": rounded(percentile(load.decode_gaps_ms, 0.99)),
            "tokens_per_chunk": round(load.tokens_per_chunk, 3),
            "max_tokens_per_chunk": load.max_chunk_tokens,
            "window_s": round(load.window_s, 3),
            "failed_streams": load.failed,
        }
    return row


def main() -> int:
    started = time.perf_counter()
    logs = client_setup("serve_stream")
    rows = []
    for n in STREAM_COUNTS:
        log(f"N = {n} streams")
        rows.append(row_for(n, logs))
    log(f"KV events: {EVENTS_PAIRS} pairs at N = {EVENTS_STREAMS}")
    cost = events_cost(logs)
    ceiling = publisher_ceiling()
    log(f"--stream-interval {INTERVAL} vs 1 at N = {INTERVAL_STREAMS}")
    interval_errors: list[str] = []
    interval = stream_interval_cost(logs, interval_errors)
    wall = time.perf_counter() - started
    log(f"done in {wall:.1f}s")
    summary = {
        "runs": rows,
        "kv_events": {**cost, "publisher_alone": ceiling},
        "stream_interval": {**interval, "errors": interval_errors},
        "throughput_speedup": TPUT_SPEEDUP,
        "throughput_max_tokens": TPUT_MAX_TOKENS,
        "itl_speedup": ITL_SPEEDUP,
        "itl_max_tokens": ITL_MAX_TOKENS,
        "prompt_len": PROMPT_LEN,
        "wall_s": round(wall, 1),
        "machine": MACHINE,
        "logs": str(logs),
    }
    emit(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
