"""Live and replay agree: one trace through `mocker serve` (real HTTP, wall clock) and through
the virtual clock gives the same passes, cached tokens and order of requests.

A loaded machine moves live passes: the loop wakes late, a request lands a pass later, a
pass that falls 50 ms behind starts from the wall clock again. So what is compared is what
cannot drift. (1) The live run again on a virtual clock, each request added at the arrival
the engine stamped and each pass stepped at its live start, must give every pass exactly
(what ran, its duration, every token, cached tokens) and every engine-recorded TTFT.
(2) `replay` of the trace as sent must give the same requests with the same cached tokens:
requests sharing a prefix come 0.5 s apart, long after the earlier one's prefill, and the
pool never evicts, so who hits whose blocks does not depend on pass timing. Its TTFTs bound
the live ones loosely."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace
from typing import Any

import httpx

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.engine.stats import FinishedRequestStats
from mocker.engine.stream import RequestStream
from mocker.mixing import splitmix64
from mocker.replay.runner import replay
from mocker.replay.trace import TraceRequest
from mocker.request import EngineRequest
from tests.support.servers import ServerThread, make_app, tokenizer

TBS = 64
# Half speed: passes last twice their modelled time. The pool holds every block of the trace.
ENGINE: dict[str, Any] = {
    "speedup_ratio": 0.5,
    "num_gpu_blocks": 1024,
    "block_size": 16,
    "max_model_len": 4096,
    "max_num_batched_tokens": 512,
    "max_num_seqs": 8,
}
GROUPS, GAP = 4, 0.125  # request i: prefix group i % 4, sent at i × 125 ms


def make_trace(num_requests: int = 16) -> list[TraceRequest]:
    """Requests of different groups overlap (each runs ~0.3 s); within a group, the k-th
    shares 1, 2, 3, 1, ... trace blocks of its group's prefix, then two unique blocks."""
    trace = []
    for i in range(num_requests):
        group, shared = i % GROUPS, 1 + i // GROUPS % 3
        ids = [1000 * group + b for b in range(shared)] + [100_000 + 2 * i, 100_001 + 2 * i]
        trace.append(TraceRequest(i * GAP, len(ids) * TBS - 7, 12, tuple(ids), 0))
    return trace


def _token(hash_id: int, position: int) -> int:
    """Prompt token `position` of trace block `hash_id` for the live requests: a fixed
    function of both, so equal ids give equal blocks there too (as a trace's hash ids mean
    equal content)."""
    return 100 + splitmix64(splitmix64(hash_id) ^ position) % 20_000


def live_prompt(item: TraceRequest) -> list[int]:
    tokens = [_token(h, p) for h in item.hash_ids for p in range(TBS)]
    return tokens[: item.input_length]


async def send_live(url: str, trace: list[TraceRequest]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:

        async def one(i: int, item: TraceRequest, start: float) -> None:
            await asyncio.sleep(max(0.0, start + item.arrival - time.monotonic()))
            body = {"model": model, "prompt": live_prompt(item),
                    "max_tokens": item.output_length, "ignore_eos": True}  # fmt: skip
            r = await http.post("/v1/completions", json=body, headers={"X-Request-Id": f"r{i}"})
            assert r.status_code == 200, r.text

        # The served name; the call also warms the connection pool before the clock starts.
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        start = time.monotonic() + 0.2
        await asyncio.gather(*(one(i, item, start) for i, item in enumerate(trace)))


def rerun(
    config: EngineConfig, requests: list[EngineRequest], passes: list[StepResult]
) -> tuple[list[StepResult], dict[str, FinishedRequestStats]]:
    """The live run again on a virtual clock: a fresh core is given each request at its live
    arrival and stepped at each live pass's start. (Before each pass, the live loop adds
    exactly the requests that arrived by the pass's start.)"""
    core = EngineCore(config, output_palette=tokenizer().palette)  # as the server's
    pending = sorted(requests, key=lambda r: r.arrival_time)
    results: list[StepResult] = []
    finished: dict[str, FinishedRequestStats] = {}
    i = 0
    for live in passes:
        while i < len(pending) and pending[i].arrival_time <= live.start:
            core.add_request(pending[i])
            i += 1
        results.append(core.step(live.start))
        finished.update((r.request_id, r) for r in results[-1].finished)
    assert i == len(pending) and not core.has_unfinished_requests()
    return results, finished


def composition(result: StepResult) -> tuple[object, ...]:
    outputs = [(o.request_id, tuple(o.new_token_ids), o.finished, o.num_cached_tokens)
               for o in result.outputs]  # fmt: skip
    return result.start, result.end, result.stats, outputs


def timeline(r: FinishedRequestStats) -> tuple[object, ...]:
    return (r.arrival_time, r.first_scheduled_time, r.first_token_time, r.finished_time,
            r.num_cached_tokens, r.num_generation_tokens)  # fmt: skip


def test_live_and_replay_agree() -> None:
    trace = make_trace()
    ids = [f"r{i}" for i in range(len(trace))]
    blocks = sum(-(-(t.input_length + t.output_length) // 16) for t in trace)
    assert blocks <= ENGINE["num_gpu_blocks"]  # room for everything: nothing is evicted

    app = make_app(**ENGINE)
    engine = app.state.mocker.engines[0]
    passes: list[StepResult] = []
    finished: dict[str, FinishedRequestStats] = {}
    sent: dict[str, EngineRequest] = {}
    observe, add = engine.on_step, engine.add_request

    def tap(result: StepResult) -> None:
        passes.append(result)
        finished.update((r.request_id, r) for r in result.finished)
        if observe is not None:
            observe(result)

    def record(spec: EngineRequest, **options: bool) -> RequestStream:
        sent[spec.request_id] = spec
        stream: RequestStream = add(spec, **options)
        return stream

    engine.on_step = tap
    engine.add_request = record
    with ServerThread(app) as server:
        asyncio.run(send_live(server.url, trace))
    assert set(finished) == set(sent) == set(ids)

    # (1) Every live pass and every request's timeline, exactly, from the live timeline.
    requests = [replace(sent[rid], arrival_time=finished[rid].arrival_time) for rid in ids]
    again, done = rerun(engine.core.config, requests, passes)
    assert [composition(r) for r in again] == [composition(r) for r in passes]
    assert {rid: timeline(r) for rid, r in done.items()} == {
        rid: timeline(r) for rid, r in finished.items()
    }
    assert sum(len(r.outputs) > 1 for r in passes) > 5  # requests ran together
    # Admitted first come, first served, by the arrivals the engine stamped.
    by_arrival = sorted(ids, key=lambda rid: finished[rid].arrival_time)
    by_admission = sorted(ids, key=lambda rid: finished[rid].first_scheduled_time or 0.0)
    assert by_admission == by_arrival

    # (2) `replay` of the trace as sent: the same requests, the same cached tokens, and each
    # group's requests in the trace's order.
    records = {r.id: r for r in replay(trace, engine.core.config, trace_block_size=TBS).records}
    assert set(records) == set(ids)
    cached = {
        rid: r.cached_tokens_device + sum(r.cached_tokens_by_tier.values())
        for rid, r in records.items()
    }
    assert {rid: finished[rid].num_cached_tokens for rid in ids} == cached
    assert sorted(set(cached.values())) == [0, 64, 128]  # misses and hits of two depths
    for group in range(GROUPS):
        members = [rid for rid in by_arrival if int(rid[1:]) % GROUPS == group]
        assert members == sorted(members, key=lambda rid: int(rid[1:]))
    # TTFTs, loosely: a late wake-up or a pass boundary crossed moves one by a pass or so.
    ratios = []
    for rid, rec in records.items():
        live = finished[rid]
        assert live.first_token_time is not None and rec.ttft is not None
        ratios.append((live.first_token_time - live.arrival_time) / rec.ttft)
    assert 0.5 <= statistics.median(ratios) <= 2.0, sorted(ratios)
