"""How many replicas one `mocker serve --replicas N` process holds on one core: memory per
replica, and whether every replica still answers /health within 1 s while streams run at a
steady rate; then 1,000 replicas behind vllm-router."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from harness import HOST, ROOT, client_setup, emit, log, mocker_argv, percentile, running

# Run from the repo root with no arguments: `.venv/bin/python bench/replicas.py`.
# The server (all its replicas) on cpu 1, this client (and the router) on cpu 0. Each size
# is a fresh process; the baseline is the same process with one replica. Progress goes to
# stderr, the last stdout line is one JSON object.
SIZES = (1, 100, 250, 500, 1000)
SPEEDUP = 1.0  # real time: the streams' pace is the engines' own
RATE = 20.0  # streams started per second, over all replicas in turn
MAX_TOKENS = 32
LOAD_S = 15.0
HEALTH_LIMIT_S = 1.0
HEALTH_CONCURRENCY = 32
ROUTER_REPLICAS = 1000
ROUTER_RATE = 5.0
ROUTER_REQUESTS = 100
PORTS = re.compile(r"mocker: (\d+) replicas on ports (\S+)")
sys.path.insert(0, str(ROOT))  # tests.support.tool_venv: the router's own venv


def _ports(text: str, first: int) -> list[int]:
    found = PORTS.search(text)
    if found is None:
        return [first]
    ports = found[2]
    if "-" in ports:
        lo, hi = map(int, ports.split("-"))
        return list(range(lo, hi + 1))
    return [int(p) for p in ports.split(",")]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _stream(client: httpx.AsyncClient, url: str) -> str | None:
    body = {"model": "mocker", "prompt": "a b c d e f g h", "max_tokens": MAX_TOKENS,
            "stream": True, "ignore_eos": True}  # fmt: skip
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return f"{resp.status_code}"
            done = False
            async for line in resp.aiter_lines():
                done = done or line == "data: [DONE]"
            return None if done else "no [DONE]"
    except httpx.HTTPError as exc:
        return type(exc).__name__


async def _streams(urls: list[str], rate: float, count: int) -> tuple[int, list[str]]:
    """`count` streams started at `rate` per second over `urls` in turn; the failures."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=10), limits=limits) as c:
        tasks = []
        started = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(_stream(c, urls[i % len(urls)])))
        results = await asyncio.gather(*tasks)
    return count, [r for r in results if r is not None]


async def _health(urls: list[str], stop: asyncio.Event) -> tuple[list[float], set[str], int]:
    """/health of every replica in turn, HEALTH_CONCURRENCY at once, until `stop` (and at
    least one sweep): each answer's latency, the replicas that answered 200, failures."""
    latencies: list[float] = []
    answered: set[str] = set()
    failures = 0
    limits = httpx.Limits(max_connections=HEALTH_CONCURRENCY)
    async with httpx.AsyncClient(timeout=5, limits=limits) as client:
        gate = asyncio.Semaphore(HEALTH_CONCURRENCY)

        async def one(url: str) -> None:
            nonlocal failures
            async with gate:
                began = time.monotonic()
                try:
                    ok = (await client.get(url + "/health")).status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.monotonic() - began)
                if ok:
                    answered.add(url)
                else:
                    failures += 1

        while True:
            await asyncio.gather(*(one(u) for u in urls))
            if stop.is_set():
                return latencies, answered, failures


async def _load(urls: list[str]) -> dict[str, Any]:
    stop = asyncio.Event()
    health = asyncio.create_task(_health(urls, stop))
    count, failed = await _streams(urls, RATE, int(RATE * LOAD_S))
    stop.set()
    latencies, answered, health_failures = await health
    worst = max(latencies, default=0.0)
    return {
        "streams": count,
        "stream_failures": len(failed),
        "health_checks": len(latencies),
        "health_p99_ms": round(1000 * (percentile(latencies, 0.99) or 0.0), 1),
        "health_max_ms": round(1000 * worst, 1),
        "replicas_answered": len(answered),
        "health_failures": health_failures,
        "holds": not failed
        and not health_failures
        and len(answered) == len(urls)
        and worst <= HEALTH_LIMIT_S,
    }


def _size(n: int, logs: Path) -> dict[str, Any]:
    argv = mocker_argv(SPEEDUP, "--replicas", str(n), "--timing-model", "polynomial",
                       "--num-gpu-blocks-override", "8192", "--max-model-len", "8192")  # fmt: skip
    began = time.monotonic()
    with running(f"replicas-{n}", argv, logs) as server:
        up = time.monotonic() - began
        urls = [f"http://{HOST}:{p}" for p in _ports(server.log_text(), server.port)]
        idle = _rss_mb(server.proc.pid)
        result = asyncio.run(_load(urls))
        result.update(replicas=n, startup_s=round(up, 1), rss_idle_mb=round(idle),
                      rss_after_mb=round(_rss_mb(server.proc.pid)))  # fmt: skip
    log(f"  {n} replicas: {result}")
    return result


def _router(logs: Path) -> dict[str, Any]:
    from tests.api.test_routers import VLLM_ROUTER, router_argv, start_router
    from tests.support.tool_venv import tool_venv

    try:
        bin_dir = tool_venv("vllm-router", VLLM_ROUTER)
    except BaseException as exc:  # pytest's Skipped: pip could not install it here
        return {"run": False, "why": f"NOT RUN: vllm-router not installable: {exc}"[:300]}
    argv = mocker_argv(SPEEDUP, "--replicas", str(ROUTER_REPLICAS), "--timing-model",
                       "polynomial", "--num-gpu-blocks-override", "8192",
                       "--max-model-len", "8192")  # fmt: skip
    with running(f"replicas-{ROUTER_REPLICAS}-router", argv, logs) as server:
        urls = [f"http://{HOST}:{p}" for p in _ports(server.log_text(), server.port)]
        began = time.monotonic()
        make = lambda port: router_argv("vllm", "round_robin", port, urls, bin_dir)  # noqa: E731
        with start_router(make, workers=len(urls)) as proxy:
            ready = time.monotonic() - began
            count, failed = asyncio.run(_streams([proxy.url], ROUTER_RATE, ROUTER_REQUESTS))
        rss = _rss_mb(server.proc.pid)
    return {"run": True, "replicas": len(urls), "router_ready_s": round(ready, 1),
            "requests": count, "failures": len(failed), "failed": failed[:5],
            "rss_mb": round(rss)}  # fmt: skip


def main() -> None:
    logs = client_setup("replicas")
    sizes = [_size(n, logs) for n in SIZES]
    base = sizes[0]["rss_idle_mb"]
    for row in sizes[1:]:
        row["mb_per_replica"] = round((row["rss_idle_mb"] - base) / (row["replicas"] - 1), 2)
    held = [row["replicas"] for row in sizes if row["holds"]]
    log(f"vllm-router in front of {ROUTER_REPLICAS} replicas")
    router = _router(logs)
    emit({"bench": "replicas", "rate_per_s": RATE, "max_tokens": MAX_TOKENS,
          "load_s": LOAD_S, "sizes": sizes, "most_replicas_held": max(held, default=0),
          "vllm_router": router})  # fmt: skip


if __name__ == "__main__":
    main()
