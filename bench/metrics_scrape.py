"""What a /metrics scrape costs: the direct text renderer against prometheus_client's
generate_latest (what /metrics served before), and what scraping does to streams' gaps.

Run from the repo root with no arguments: `.venv/bin/python bench/metrics_scrape.py`. Progress
goes to stderr; the last stdout line is one JSON object. About a minute.

Why it matters: the scrape runs on the event loop of the engine's passes (vLLM's runs in its
API server, beside an engine core in another process), so its whole time is a gap in every
stream. Routers scrape often: llm-d's endpoint picker every 50 ms.

- render: in this process, pinned to one core, engines fed by a virtual run (histograms with
  counts), 1 and 4 engines (data-parallel ranks). Per iteration, one observation lands in
  each engine's TTFT, ITL and e2e histograms (as between two scrapes of a loaded server),
  then the old and the new renderer run, in alternating order; medians of ITERATIONS. The
  two bodies are checked equal, family by family, values aside.
- live: `mocker serve` at speedup 1 on the server core, 100 streams of 64 tokens from the
  client core, once with a scraper on the client's event loop every SCRAPE_PERIOD_S and
  once without, alternating, LIVE_ROUNDS each: the streams' decode gap p50/p99 (ms), and the
  server's CPU share over the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop
from harness import (
    MACHINE,
    SERVER_CPU,
    attempt,
    client_setup,
    emit,
    log,
    percentile,
    pin,
    rounded,
    running,
)
from prometheus_client import generate_latest
from serve_stream import ITL_MAX_TOKENS, ITL_SPEEDUP, run_load, scrape_bytes, serve_argv

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.stats import EngineSnapshot
from mocker.engine.virtual import VirtualDriver
from mocker.metrics import Exposition, MetricsCollector, StatsRecorder, build_registry
from mocker.request import EngineRequest, SamplingParams

ITERATIONS = 300
ENGINE_COUNTS = (1, 4)
LIVE_STREAMS = 100
LIVE_ROUNDS = 3
SCRAPE_PERIOD_S = 0.05  # llm-d's endpoint picker refreshes its metrics this often


def fed_recorder(rank: int) -> StatsRecorder:
    """An engine's recorder after 200 requests on the virtual clock."""
    core = EngineCore(EngineConfig.of(num_gpu_blocks=4096))
    metrics = StatsRecorder(core.config, engine=str(rank))
    requests = [
        EngineRequest(
            f"r{i}",
            [(i * 31 + j) % 30_000 + 2 for j in range(64 + i % 200)],
            SamplingParams(max_tokens=16 + i % 64, ignore_eos=True),
            arrival_time=i * 0.02,
        )
        for i in range(200)
    ]
    for result in VirtualDriver(core).steps(requests):
        metrics.on_step(result)
    metrics.snapshot = lambda: EngineSnapshot(3, 1, 0.25)
    return metrics


def families(body: bytes) -> list[str]:
    """Every sample's name and labels, values left out (process CPU and GC move between
    two renders)."""
    return [line.rsplit(" ", 1)[0] for line in body.decode().splitlines()]


def render_cost(engines: int) -> dict[str, Any]:
    recorders = [fed_recorder(rank) for rank in range(engines)]
    collector = MetricsCollector(recorders, "mocker")
    registry = build_registry(collector)
    exposition = Exposition(collector)
    old_body, new_body = generate_latest(registry), exposition.render()
    if families(old_body) != families(new_body):
        raise SystemExit("the two renderers disagree")
    old: list[float] = []
    new: list[float] = []
    for i in range(ITERATIONS):
        for m in recorders:  # between two scrapes of a loaded server, these move
            m.ttft.observe(0.05 + i * 1e-4)
            m.itl.observe(0.006)
            m.e2e.observe(1.5)
        for label in ("old", "new") if i % 2 else ("new", "old"):
            t0 = time.perf_counter_ns()
            if label == "old":
                generate_latest(registry)
            else:
                exposition.render()
            (old if label == "old" else new).append((time.perf_counter_ns() - t0) / 1000)
    result = {
        "engines": engines,
        "body_bytes": len(new_body),
        "lines": new_body.count(b"\n"),
        "generate_latest_us_median": round(statistics.median(old), 1),
        "direct_us_median": round(statistics.median(new), 1),
        "speedup": round(statistics.median(old) / statistics.median(new), 2),
    }
    log(f"render, {engines} engine(s): generate_latest {result['generate_latest_us_median']} µs,"
        f" direct {result['direct_us_median']} µs ({result['speedup']}x)")  # fmt: skip
    return result


async def scraper(port: int, count: list[int]) -> None:
    while True:
        await asyncio.sleep(SCRAPE_PERIOD_S)
        with contextlib.suppress(OSError):
            await scrape_bytes(port)
            count[0] += 1


async def live_once(scraping: bool, logs: Path) -> dict[str, Any]:
    with running("mocker-scrape", serve_argv(ITL_SPEEDUP), logs) as server:
        count = [0]
        task = asyncio.get_running_loop().create_task(scraper(server.port, count))
        if not scraping:
            task.cancel()
        try:
            load = await run_load(server.port, server.proc.pid, LIVE_STREAMS, ITL_MAX_TOKENS)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return {
        "decode_gap_p50_ms": percentile(load.decode_gaps_ms, 0.5),
        "decode_gap_p99_ms": percentile(load.decode_gaps_ms, 0.99),
        "scrapes": count[0],
        "server_cpu": load.server_cpu,
        "failed": load.failed,
    }


def live() -> dict[str, Any]:
    logs = client_setup("metrics-scrape")
    runs: dict[str, list[dict[str, Any]]] = {"scraped": [], "unscraped": []}
    for r in range(LIVE_ROUNDS):
        for scraping in (True, False) if r % 2 == 0 else (False, True):
            run = uvloop.run(live_once(scraping, logs))
            runs["scraped" if scraping else "unscraped"].append(run)
            log(f"live {'scraped' if scraping else 'unscraped'}: gap p50"
                f" {run['decode_gap_p50_ms']:.2f} p99 {run['decode_gap_p99_ms']:.2f} ms,"
                f" {run['scrapes']} scrapes, failed {run['failed']}")  # fmt: skip
    out: dict[str, Any] = {"streams": LIVE_STREAMS, "scrape_period_s": SCRAPE_PERIOD_S}
    for name, group in runs.items():
        out[name] = {
            "decode_gap_p50_ms_median": rounded(
                statistics.median(g["decode_gap_p50_ms"] for g in group)
            ),
            "decode_gap_p99_ms_median": rounded(
                statistics.median(g["decode_gap_p99_ms"] for g in group)
            ),
            "decode_gap_p99_ms_runs": [rounded(g["decode_gap_p99_ms"]) for g in group],
            "scrapes": [g["scrapes"] for g in group],
            "server_cpu_median": rounded(statistics.median(g["server_cpu"] for g in group)),
            "failed": sum(g["failed"] for g in group),
        }
    return out


def main() -> None:
    errors: list[str] = []
    pin(SERVER_CPU)
    renders = [attempt(errors, f"render {n}", lambda n=n: render_cost(n)) for n in ENGINE_COUNTS]
    emit({
        "machine": MACHINE,
        "iterations": ITERATIONS,
        "render": [r for r in renders if r is not None],
        "live": attempt(errors, "live", live),
        "errors": errors,
    })  # fmt: skip


if __name__ == "__main__":
    main()
