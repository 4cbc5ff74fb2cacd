"""Host (G2) tier on a repeated working set: hit rate by tier, TTFT, bytes moved, step cost.

Run from the repo root with no arguments: `.venv/bin/python bench/offload.py`. Progress goes
to stderr; the last stdout line is one JSON object.

The scenario: NUM_PROMPTS distinct prompts whose blocks total ~4x the device pool (and fit the
host tier) are sent ROUNDS times, in the same order each round. The device pool alone keeps
only the last quarter of a round, and LRU evicts it before the next round gets there, so
without a host tier rounds 2+ find almost nothing; with one they should find their prompts
on host and load them instead of recomputing.

Three parts, each comparing with vs without the host tier in the same run:
- replay: the virtual-clock engine (speedup 1, Poisson arrivals), per-request accounting;
  hit rate by tier, TTFT p50/p99 (engine timestamps), stored and loaded bytes. A
  write-through run is reported alongside the default evict policy, as extra detail.
- step cost: the same replay, repeated STEP_REPS times per config, alternating with and
  without the host tier, timing every `EngineCore.step()` call (the engine's own work;
  arrivals and prompt hashing happen outside step() and are not counted); then again with
  arrivals faster than the engine serves them (a deep queue, more requests per pass).
- live: `mocker serve` at a high speedup on core 1, this client on core 0, the same rounds
  as streamed completions at a fixed concurrency; client TTFT, hits from /metrics.

The machine has two shared, noisy cores: compare ratios within one run, not absolute
figures across runs.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import (
    HOST,
    MACHINE,
    Wanted,
    attempt,
    client_setup,
    counters,
    cpu_seconds,
    deltas,
    emit,
    log,
    mocker_argv,
    percentile,
    rounded,
    running,
    scrape,
)
from sse_client import KeepAliveClient, Stream, completion_body, completion_request

from mocker.compiled import ENV as COMPILED_ENV
from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.engine.stats import FinishedRequestStats
from mocker.engine.virtual import VirtualDriver, VirtualRun
from mocker.request import EngineRequest, SamplingParams
from mocker.storage_spec import StorageTierSpec
from mocker.tiers.transfers import TransferKind

# Tiered engines run on the Python device pool (the compiled one serves no tiers): so do
# the tier-free baselines here, and the ratios measure the tiers, not the two pools.
# (Inherited by the children and servers this starts; set MOCKER_COMPILED to override.)
os.environ.setdefault(COMPILED_ENV, "0")

# -- the scenario (shared by all three parts) --
BLOCK_SIZE = 16  # 2 MiB per block with the default llama-3-8b shape
NUM_GPU_BLOCKS = 2048  # 32k tokens of device KV
NUM_HOST_BLOCKS = 10_000  # the issue's host-tier size; holds the whole working set
NUM_PROMPTS = 125
PROMPT_BLOCKS = (48, 80)  # uniform, in whole blocks: mean 64 blocks = 1024 tokens
ROUNDS = 3  # the same prompts, same order, each round
MAX_TOKENS = 8
MAX_MODEL_LEN = 16384  # <= NUM_GPU_BLOCKS * BLOCK_SIZE, as `mocker serve` requires
SEED = 0
VOCAB_LOW, VOCAB_HIGH = 2, 120_000  # random prompt ids; eos (1) and 0 excluded

# -- replay --
REPLAY_RATE = 20.0  # Poisson arrivals per simulated second; the no-host engine keeps up
REPLAY_SPEEDUP = 1.0

# -- step cost --
STEP_REPS = 21  # replays per config and workload, alternating with / without host tier
SATURATED_RATE = 60.0  # arrivals faster than either config serves them: a deep queue
STEP_COST_TARGET = 1.20  # the host tier should add < 20% to step cost

# -- live --
LIVE_SPEEDUP = 20.0
LIVE_CONCURRENCY = 16
LIVE_REPS = 8  # servers per config, alternating which starts
SETTLE_S = 0.3  # before a /metrics scrape: let stores in flight end and counters update

REQUEST_TIMEOUT_S = 60.0


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, digits)


def working_set() -> list[list[int]]:
    """NUM_PROMPTS distinct random prompts, whole blocks each (no partial last block)."""
    rng = random.Random(SEED)
    lo, hi = PROMPT_BLOCKS
    return [
        [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randint(lo, hi) * BLOCK_SIZE)]
        for _ in range(NUM_PROMPTS)
    ]


def request_id(rnd: int, i: int) -> str:
    return f"r{rnd}-{i}"


def round_of(rid: str) -> int:
    return int(rid[1 : rid.index("-")])


def replay_requests(prompts: list[list[int]], rate: float) -> list[EngineRequest]:
    """The rounds back to back as one Poisson stream (same seed: same times every run)."""
    rng = random.Random(SEED + 1)
    t = 0.0
    out = []
    for rnd in range(ROUNDS):
        for i, prompt in enumerate(prompts):
            t += rng.expovariate(rate)
            out.append(
                EngineRequest(
                    request_id(rnd, i),
                    prompt,
                    SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
                    arrival_time=t,
                )
            )
    return out


# -- replay and step cost ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    num_cpu_blocks: int
    offload_policy: str = "evict"
    storage_tiers: tuple[StorageTierSpec, ...] = ()  # below the CPU tier (bench/tiers.py)

    def engine(self, speedup: float) -> EngineConfig:
        return EngineConfig.of(
            block_size=BLOCK_SIZE,
            num_gpu_blocks=NUM_GPU_BLOCKS,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            max_model_len=MAX_MODEL_LEN,
            num_cpu_blocks=self.num_cpu_blocks,
            offload_policy=self.offload_policy,
            storage_tiers=self.storage_tiers,
            speedup_ratio=speedup,
            seed=SEED,
        )


WITH_HOST = Config("with_host", NUM_HOST_BLOCKS)
WITHOUT_HOST = Config("without_host", 0)
WRITE_THROUGH = Config("with_host_write_through", NUM_HOST_BLOCKS, "write-through")


def hit_summary(requests: list[FinishedRequestStats]) -> dict[str, Any]:
    """Hit rate by tier (hit tokens / prompt tokens) and engine TTFT over these requests."""
    prompt = sum(r.num_prompt_tokens for r in requests)
    cached = sum(r.num_cached_tokens for r in requests)
    host = sum(r.num_tier_cached_tokens for r in requests)
    ttfts = [
        (r.first_token_time - r.arrival_time) * 1000
        for r in requests
        if r.first_token_time is not None
    ]
    by_tier: dict[str, int] = {}
    for r in requests:
        for name, n in r.tier_hits:
            by_tier[name] = by_tier.get(name, 0) + n
    return {
        "requests": len(requests),
        "prompt_tokens": prompt,
        "device_hit_rate": rounded(ratio(cached - host, prompt, 6), 4),
        "host_hit_rate": rounded(ratio(host, prompt, 6), 4),
        "tier_hit_rates": {name: rounded(ratio(n, prompt, 6), 4) for name, n in by_tier.items()},
        "ttft_p50_ms": rounded(percentile(ttfts, 0.5)),
        "ttft_p99_ms": rounded(percentile(ttfts, 0.99)),
        "ttft_mean_ms": rounded(statistics.fmean(ttfts) if ttfts else None),
        "preemptions": sum(r.num_preemptions for r in requests),
    }


def replay_once(cfg: Config, requests: list[EngineRequest]) -> dict[str, Any]:
    """One virtual-clock run; every core.step() call is timed.

    gc is disabled for the run (collected just before) so a collection triggered by earlier
    garbage does not land in one config's steps; the runs are small enough not to need it.
    """
    core = EngineCore(cfg.engine(REPLAY_SPEEDUP))
    real_step = core.step
    timing = {"ns": 0, "calls": 0, "idle_calls": 0}

    def timed_step(now: float) -> StepResult:
        t0 = time.perf_counter_ns()
        result = real_step(now)
        timing["ns"] += time.perf_counter_ns() - t0
        timing["calls"] += 1
        if result.idle:
            timing["idle_calls"] += 1
        return result

    core.step = timed_step  # type: ignore[method-assign]
    run = VirtualRun()
    moved = {TransferKind.STORE: [0, 0], TransferKind.LOAD: [0, 0]}  # transfers, bytes
    stats_hits = [0, 0, 0]  # prefix queries, device hits, host hits (tokens, from SchedulerStats)
    running = 0
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for result in VirtualDriver(core).steps(requests, run=run):
            for record in result.transfers:
                if record.ok:  # (a failed promotion moved nothing)
                    moved[record.kind][0] += 1
                    moved[record.kind][1] += record.nbytes
            stats_hits[0] += result.stats.prefix_queries
            stats_hits[1] += result.stats.prefix_hits
            stats_hits[2] += result.stats.external_prefix_hits
            if not result.idle:
                running += result.stats.num_running
        driver_ns = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    later = [r for r in run.finished if round_of(r.request_id) > 0]
    by_round = [
        hit_summary([r for r in run.finished if round_of(r.request_id) == k]) for k in range(ROUNDS)
    ]
    offload = core.connector
    block_bytes = core.config.block_bytes
    all_summary = hit_summary(run.finished)
    return {
        "rounds_2plus": hit_summary(later),
        "all": all_summary,
        "host_hit_rate_by_round": [s["host_hit_rate"] for s in by_round],
        "device_hit_rate_by_round": [s["device_hit_rate"] for s in by_round],
        "ttft_p50_ms_by_round": [s["ttft_p50_ms"] for s in by_round],
        "stored_bytes": moved[TransferKind.STORE][1],
        "loaded_bytes": moved[TransferKind.LOAD][1],
        "store_transfers": moved[TransferKind.STORE][0],
        "load_transfers": moved[TransferKind.LOAD][0],
        "bytes_match_offload_counters": offload is None
        or (
            offload.stored_blocks * block_bytes == moved[TransferKind.STORE][1]
            and offload.loaded_blocks * block_bytes == moved[TransferKind.LOAD][1]
        ),
        # The per-request hit accounting against the per-step stats (admissions only).
        "step_stats_hit_tokens": {"device": stats_hits[1], "host": stats_hits[2]},
        "finished": len(run.finished),
        "rejected": len(run.rejected),
        "passes": run.num_steps,
        "mean_running_per_pass": rounded(running / max(1, run.num_steps), 2),
        "virtual_end_s": round(run.end_time, 3),
        "_timing": {**timing, "driver_ns": driver_ns},
    }


def signature(result: dict[str, Any]) -> tuple[Any, ...]:
    """What a deterministic replay must reproduce exactly, rep after rep."""
    return (
        result["all"]["prompt_tokens"],
        result["all"]["device_hit_rate"],
        result["all"]["host_hit_rate"],
        result["all"]["ttft_mean_ms"],
        result["stored_bytes"],
        result["loaded_bytes"],
        result["passes"],
    )


def time_configs(
    label: str,
    requests: list[EngineRequest],
    configs: Sequence[Config],
    baseline: Config,
    reps: int = STEP_REPS,
) -> dict[str, Any]:
    """`reps` replays of each config and the baseline, the order rotated each rep (a drift in
    machine speed hits all alike); returns the timings, each config's ratios to the
    baseline (medians over reps), each config's first run (its metrics), and whether every
    rep reproduced that run exactly."""
    everyone = [*configs, baseline]
    names = [c.name for c in everyone]
    firsts: dict[str, dict[str, Any]] = {}
    signatures: dict[str, set[tuple[Any, ...]]] = {n: set() for n in names}
    per_pass: dict[str, list[float]] = {n: [] for n in names}
    per_call: dict[str, list[float]] = {n: [] for n in names}
    per_request: dict[str, list[float]] = {n: [] for n in names}
    driver_per_request: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(everyone)
        for cfg in everyone[k:] + everyone[:k]:
            result = replay_once(cfg, requests)
            t = result.pop("_timing")
            firsts.setdefault(cfg.name, result)
            signatures[cfg.name].add(signature(result))
            passes = t["calls"] - t["idle_calls"]
            # Per pass: all of step()'s time (idle calls too) over the calls that ran a pass,
            # so cheap idle calls (waiting on transfers) cannot dilute the tiers' cost.
            per_pass[cfg.name].append(t["ns"] / max(1, passes) / 1000)
            per_call[cfg.name].append(t["ns"] / max(1, t["calls"]) / 1000)
            per_request[cfg.name].append(t["ns"] / len(requests) / 1000)
            driver_per_request[cfg.name].append(t["driver_ns"] / len(requests) / 1000)
        log(f"  {label} rep {rep}: us/pass " + ", ".join(
            f"{n} {per_pass[n][-1]:6.1f} ({firsts[n]['passes']} passes)" for n in names
        ))  # fmt: skip

    def medians(samples: dict[str, list[float]], digits: int = 2) -> dict[str, float]:
        return {name: round(statistics.median(v), digits) for name, v in samples.items()}

    def med_ratios(samples: dict[str, list[float]]) -> dict[str, float | None]:
        base = statistics.median(samples[baseline.name])
        return {c.name: ratio(statistics.median(samples[c.name]), base) for c in configs}

    return {
        "timing": {
            "requests": len(requests),
            "us_per_pass_median": medians(per_pass),
            "us_per_pass_all": {k: [round(x, 1) for x in v] for k, v in per_pass.items()},
            "us_per_call_median": medians(per_call),
            "step_us_per_request_median": medians(per_request, 1),
            "driver_us_per_request_median": medians(driver_per_request, 1),
            "passes": {name: r["passes"] for name, r in firsts.items()},
            "mean_running_per_pass": {
                name: r["mean_running_per_pass"] for name, r in firsts.items()
            },
            "ratio_per_pass": med_ratios(per_pass),
            "ratio_per_call": med_ratios(per_call),
            "ratio_per_request": med_ratios(per_request),
            "ratio_driver_per_request": med_ratios(driver_per_request),
            "deterministic": all(len(sigs) == 1 for sigs in signatures.values()),
        },
        "firsts": firsts,
    }


def step_cost_workload(label: str, requests: list[EngineRequest]) -> dict[str, Any]:
    """With the host tier against without: the ratios as single numbers."""
    timed = time_configs(label, requests, [WITH_HOST], WITHOUT_HOST)
    timing = timed["timing"]
    for key in ("ratio_per_pass", "ratio_per_call", "ratio_per_request",
                "ratio_driver_per_request"):  # fmt: skip
        timing[key] = timing[key][WITH_HOST.name]
    return timed


def replay_and_step_cost(prompts: list[list[int]]) -> dict[str, Any]:
    scenario = step_cost_workload("scenario", replay_requests(prompts, REPLAY_RATE))
    saturated = step_cost_workload("saturated", replay_requests(prompts, SATURATED_RATE))
    replay = scenario["firsts"]
    wt = replay_once(WRITE_THROUGH, replay_requests(prompts, REPLAY_RATE))
    wt.pop("_timing")
    replay[WRITE_THROUGH.name] = wt
    for name, r in replay.items():
        r2 = r["rounds_2plus"]
        log(
            f"  replay {name:23s}: rounds 2+ host hit {r2['host_hit_rate']} device hit"
            f" {r2['device_hit_rate']}, ttft p50 {r2['ttft_p50_ms']} ms p99 {r2['ttft_p99_ms']}"
            f" ms; stored {r['stored_bytes'] / 2**30:.1f} GiB loaded"
            f" {r['loaded_bytes'] / 2**30:.1f} GiB"
        )
    step_cost = {
        "reps_per_config": STEP_REPS,
        "scenario": {"arrival_rate_per_s": REPLAY_RATE, **scenario["timing"]},
        "saturated": {"arrival_rate_per_s": SATURATED_RATE, **saturated["timing"]},
        "notes": (
            "scenario = the replay above; saturated = the same prompts and rounds arriving "
            "faster than the engine serves them (deep queue, more requests per pass). "
            "us_per_pass = all time in EngineCore.step() (idle calls included) / calls that "
            "ran a pass; us_per_call divides by every call. The configs run different "
            "passes (loads replace prefill chunks), so step_us_per_request (step() time for "
            "the whole replay / requests) is also given; driver_* adds the driver loop, "
            "arrivals and prompt hashing. gc disabled while timing. Medians over reps, "
            "with and without alternating; ratios are with host / without."
        ),
    }
    return {"replay": replay, "step_cost": step_cost}


# -- live servers -----------------------------------------------------------------------------


def serve_argv(host_blocks: int) -> list[str]:
    flags = [
        "--block-size", str(BLOCK_SIZE),
        "--num-gpu-blocks-override", str(NUM_GPU_BLOCKS),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--seed", str(SEED),
    ]  # fmt: skip
    if host_blocks:
        flags += ["--num-host-blocks", str(host_blocks)]
    return mocker_argv(LIVE_SPEEDUP, *flags)


LIVE_METRICS: Wanted = {
    "host_hit_tokens": ("vllm:prompt_tokens_cached_by_source_total", {"source": "host"}),
    "device_hit_tokens": ("vllm:prompt_tokens_cached_by_source_total", {"source": "device"}),
    "prompt_tokens": ("vllm:prompt_tokens_total", {}),
    "stored_bytes": ("vllm:kv_offload_store_bytes_total", {}),
    "loaded_bytes": ("vllm:kv_offload_load_bytes_total", {}),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum", {}),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", {}),
}


async def live_counters(port: int) -> dict[str, float]:
    return counters(await asyncio.to_thread(scrape, port), LIVE_METRICS)


# -- the live client --------------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    """One streamed completion as the client saw it, and its round."""

    round: int
    stream: Stream


async def live_rounds(port: int, pid: int, prompts: list[list[int]]) -> dict[str, Any]:
    """ROUNDS rounds, LIVE_CONCURRENCY requests in flight, prompts in order within a round;
    /metrics scraped before the first round, after the first and after the last."""
    requests = [
        completion_request(HOST, port, completion_body(p, MAX_TOKENS), keep_alive=True)
        for p in prompts
    ]
    samples: list[Sample] = []
    scrapes = [await live_counters(port)]
    # One kept-alive connection per worker, across the rounds.
    clients = [KeepAliveClient(HOST, port) for _ in range(LIVE_CONCURRENCY)]

    async def worker(client: KeepAliveClient, todo: Iterator[int]) -> list[tuple[int, Stream]]:
        return [(i, await client.stream(requests[i], REQUEST_TIMEOUT_S)) for i in todo]

    cpu0, mine0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    try:
        for rnd in range(ROUNDS):
            todo = iter(range(len(requests)))
            done = await asyncio.gather(*(worker(c, todo) for c in clients))
            in_order = sorted((pair for pairs in done for pair in pairs), key=lambda p: p[0])
            samples += [Sample(rnd, stream) for _, stream in in_order]
            if rnd == 0:
                await asyncio.sleep(SETTLE_S)
                scrapes.append(await live_counters(port))
    finally:
        for c in clients:
            c.close()
    window = time.perf_counter() - t0
    cpu1, mine1 = cpu_seconds(pid), time.process_time()
    await asyncio.sleep(SETTLE_S)
    scrapes.append(await live_counters(port))
    return {
        "samples": samples,
        "scrapes": scrapes,
        "window_s": window,
        "server_cpu_s": cpu1 - cpu0,
        "client_cpu_s": mine1 - mine0,
    }


def live_summary(raw: dict[str, Any]) -> dict[str, Any]:
    samples: list[Sample] = raw["samples"]
    before, after_first, end = raw["scrapes"]
    later = deltas(end, after_first)  # rounds 2+ only
    whole = deltas(end, before)
    failures = [s.stream.failure for s in samples]
    ok_later = [s.stream for s, f in zip(samples, failures, strict=True) if s.round > 0 and not f]
    ttfts = [s.ttft_ms for s in ok_later if s.ttft_ms is not None]
    lats = [s.latency_ms for s in ok_later if s.latency_ms is not None]
    client_prompt = sum(s.prompt_tokens for s in ok_later)
    errors = sorted({f for f in failures if f is not None})
    return {
        "requests": len(samples),
        "failed": sum(1 for f in failures if f is not None),
        "rounds_2plus": {
            "host_hit_rate": rounded(ratio(later["host_hit_tokens"], later["prompt_tokens"], 6), 4),
            "device_hit_rate": rounded(
                ratio(later["device_hit_tokens"], later["prompt_tokens"], 6), 4
            ),
            "client_cached_rate": rounded(
                ratio(sum(s.cached_tokens for s in ok_later), client_prompt, 6), 4
            ),
            "client_ttft_p50_ms": rounded(percentile(ttfts, 0.5)),
            "client_ttft_p99_ms": rounded(percentile(ttfts, 0.99)),
            "client_latency_p50_ms": rounded(percentile(lats, 0.5)),
            "client_latency_p99_ms": rounded(percentile(lats, 0.99)),
            "engine_ttft_mean_ms": rounded(ratio(later["ttft_sum"] * 1000, later["ttft_count"], 6)),
            "prompt_tokens": int(later["prompt_tokens"]),
        },
        "all_rounds": {
            "host_hit_rate": rounded(ratio(whole["host_hit_tokens"], whole["prompt_tokens"], 6), 4),
            "device_hit_rate": rounded(
                ratio(whole["device_hit_tokens"], whole["prompt_tokens"], 6), 4
            ),
            "engine_ttft_mean_ms": rounded(ratio(whole["ttft_sum"] * 1000, whole["ttft_count"], 6)),
        },
        "stored_bytes": int(whole["stored_bytes"]),
        "loaded_bytes": int(whole["loaded_bytes"]),
        "window_s": round(raw["window_s"], 3),
        "requests_per_s": round(len(samples) / raw["window_s"], 1),
        "server_cpu_ms_per_request": round(raw["server_cpu_s"] * 1000 / len(samples), 3),
        "client_cpu_frac": round(raw["client_cpu_s"] / raw["window_s"], 3),
        **({"errors": errors[:3]} if errors else {}),
    }


def live_once(cfg: Config, prompts: list[list[int]], logs: Path) -> dict[str, Any]:
    with running(f"mocker-{cfg.name}", serve_argv(cfg.num_cpu_blocks), logs) as s:
        raw = uvloop.run(live_rounds(s.port, s.proc.pid, prompts))
    summary = live_summary(raw)
    issues = s.log_issues()
    if issues:
        summary["server_log_issues"] = issues[:3]
        log(f"  {cfg.name} log: {len(issues)} suspicious lines: {issues[0]}")
    r2 = summary["rounds_2plus"]
    log(
        f"  live {cfg.name:12s}: {summary['requests']} requests in {summary['window_s']:.1f}s,"
        f" failed {summary['failed']}; rounds 2+ host hit {r2['host_hit_rate']}"
        f" device hit {r2['device_hit_rate']}; client ttft p50 {r2['client_ttft_p50_ms']} ms"
        f" p99 {r2['client_ttft_p99_ms']} ms; engine ttft mean {r2['engine_ttft_mean_ms']} ms;"
        f" server cpu {summary['server_cpu_ms_per_request']} ms/request"
    )
    return summary


LIVE_MEDIAN_KEYS = (
    "host_hit_rate",
    "device_hit_rate",
    "client_cached_rate",
    "client_ttft_p50_ms",
    "client_ttft_p99_ms",
    "client_latency_p50_ms",
    "client_latency_p99_ms",
    "engine_ttft_mean_ms",
)


def live(prompts: list[list[int]], logs: Path, errors: list[str]) -> dict[str, Any]:
    w, wo = WITH_HOST.name, WITHOUT_HOST.name
    runs: dict[str, list[dict[str, Any]]] = {w: [], wo: []}
    for rep in range(LIVE_REPS):
        order = (WITH_HOST, WITHOUT_HOST) if rep % 2 == 0 else (WITHOUT_HOST, WITH_HOST)
        for cfg in order:
            run = attempt(
                errors, f"live {cfg.name} rep {rep}", lambda c=cfg: live_once(c, prompts, logs)
            )
            if run is not None:
                runs[cfg.name].append(run)
    if not runs[w] or not runs[wo]:
        raise RuntimeError("no complete live run for one of the configs")

    def med(values: list[Any]) -> float | None:
        present = [v for v in values if v is not None]
        return None if not present else round(statistics.median(present), 4)

    medians: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        m = {key: med([r["rounds_2plus"][key] for r in rs]) for key in LIVE_MEDIAN_KEYS}
        for key in ("server_cpu_ms_per_request", "requests_per_s"):
            m[key] = med([r[key] for r in rs])
        for key in ("stored_bytes", "loaded_bytes"):
            m[key] = int(statistics.median(r[key] for r in rs))
        m["failed_requests"] = sum(r["failed"] for r in rs)
        m["runs"] = len(rs)
        medians[name] = m
    out: dict[str, Any] = {
        "speedup": LIVE_SPEEDUP,
        "concurrency": LIVE_CONCURRENCY,
        "reps_per_config": LIVE_REPS,
        w: medians[w],
        wo: medians[wo],
    }
    for key in ("client_ttft_p50_ms", "client_ttft_p99_ms", "engine_ttft_mean_ms"):
        out[f"{key}_ratio"] = ratio(medians[w][key], medians[wo][key])
    out["server_cpu_per_request_ratio"] = ratio(
        medians[w]["server_cpu_ms_per_request"], medians[wo]["server_cpu_ms_per_request"]
    )
    # Each run in brief; the medians above carry the rest.
    out["runs"] = {
        name: [
            {
                "client_ttft_p50_ms": r["rounds_2plus"]["client_ttft_p50_ms"],
                "client_ttft_p99_ms": r["rounds_2plus"]["client_ttft_p99_ms"],
                "engine_ttft_mean_ms": r["rounds_2plus"]["engine_ttft_mean_ms"],
                "host_hit_rate": r["rounds_2plus"]["host_hit_rate"],
                "server_cpu_ms_per_request": r["server_cpu_ms_per_request"],
                "window_s": r["window_s"],
                "failed": r["failed"],
                **{k: r[k] for k in ("errors", "server_log_issues") if k in r},
            }
            for r in rs
        ]
        for name, rs in runs.items()
    }
    out["notes"] = (
        "hit rates and TTFT over rounds 2+ (/metrics scraped after round 1 and at the end); "
        "client_ttft = send to first streamed token; engine_ttft_mean from the "
        "vllm:time_to_first_token_seconds histogram; per config: medians over its runs."
    )
    return out


# -- main -------------------------------------------------------------------------------------


def main() -> int:
    started = time.perf_counter()
    logs = client_setup("offload")  # the replays run on the client's core too
    errors: list[str] = []
    prompts = working_set()
    blocks = sum(len(p) for p in prompts) // BLOCK_SIZE
    log(
        f"working set: {NUM_PROMPTS} prompts, {blocks} blocks = {blocks / NUM_GPU_BLOCKS:.2f}x"
        f" the device pool ({NUM_GPU_BLOCKS}), host tier {NUM_HOST_BLOCKS}; {ROUNDS} rounds"
    )
    log(f"replay + step cost ({STEP_REPS} reps per config, alternating)")
    offline = attempt(errors, "replay", lambda: replay_and_step_cost(prompts)) or {}
    log(f"live (speedup {LIVE_SPEEDUP:g}, concurrency {LIVE_CONCURRENCY})")
    live_result = attempt(errors, "live", lambda: live(prompts, logs, errors))
    wall = time.perf_counter() - started

    replay = offline.get("replay", {})
    step_cost = offline.get("step_cost", {})
    with_r2 = replay.get(WITH_HOST.name, {}).get("rounds_2plus", {})
    without_r2 = replay.get(WITHOUT_HOST.name, {}).get("rounds_2plus", {})
    step_ratio = step_cost.get("scenario", {}).get("ratio_per_pass")
    summary: dict[str, Any] = {
        "host_hit_rate": with_r2.get("host_hit_rate"),
        "ttft_p50_ms_with_host": with_r2.get("ttft_p50_ms"),
        "ttft_p50_ms_without_host": without_r2.get("ttft_p50_ms"),
        "ttft_p99_ms_with_host": with_r2.get("ttft_p99_ms"),
        "ttft_p99_ms_without_host": without_r2.get("ttft_p99_ms"),
        "device_hit_rate_without_host": without_r2.get("device_hit_rate"),
        "step_cost_ratio": step_ratio,
        "step_cost_ratio_saturated": step_cost.get("saturated", {}).get("ratio_per_pass"),
        "step_cost_ratio_per_request": step_cost.get("scenario", {}).get("ratio_per_request"),
        "step_cost_target_met": None if step_ratio is None else step_ratio < STEP_COST_TARGET,
        "notes": (
            "host_hit_rate and ttft_* are from the virtual-clock replay (speedup 1, evict "
            "policy), over rounds 2+ only; ttft = first_token_time - arrival_time. "
            "step_cost_ratio = median us of EngineCore.step() per pass on that replay, with host "
            "tier / without; _saturated: the same with a deep queue; _per_request: step() time "
            "per request (see step_cost.notes). Hit rates are hit tokens / prompt tokens."
        ),
        "scenario": {
            "prompts": NUM_PROMPTS,
            "working_set_blocks": blocks,
            "working_set_over_device": round(blocks / NUM_GPU_BLOCKS, 2),
            "num_gpu_blocks": NUM_GPU_BLOCKS,
            "num_cpu_blocks": NUM_HOST_BLOCKS,
            "block_size": BLOCK_SIZE,
            "rounds": ROUNDS,
            "max_tokens": MAX_TOKENS,
            "replay_rate_per_s": REPLAY_RATE,
        },
        "replay": replay,
        "step_cost": step_cost,
        "live": live_result,
        "wall_s": round(wall, 1),
        "machine": MACHINE,
        "logs": str(logs),
        "errors": errors,
    }
    log(f"done in {wall:.1f}s")
    emit(summary)
    required = ("host_hit_rate", "ttft_p50_ms_with_host", "ttft_p50_ms_without_host")
    return 1 if step_ratio is None or any(summary[k] is None for k in required) else 0


if __name__ == "__main__":
    sys.exit(main())
