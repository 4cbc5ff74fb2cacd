"""Live and replay agree: one trace through `mocker serve` (real HTTP, wall clock) and through
`replay` (virtual clock) gives the same cached tokens and engine-recorded TTFTs per request."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import httpx

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.replay.prompts import PromptBuilder
from mocker.replay.runner import replay
from mocker.replay.trace import SyntheticSpec, TraceRequest, synthetic_trace
from mocker.request import EngineRequest, Request, SamplingParams
from tests.support.servers import ServerThread, make_app

TBS = 64
# Half speed: passes last twice their modelled time, so a millisecond of client or loop
# jitter is small next to them (the trace's arrival times are scaled to match).
ENGINE: dict[str, Any] = {
    "speedup_ratio": 0.5,
    "num_gpu_blocks": 96,
    "block_size": 16,
    "max_model_len": 4096,
    "max_num_batched_tokens": 512,
    "max_num_seqs": 8,
}
_MASK = (1 << 64) - 1


def _token(hash_id: int, position: int) -> int:
    """Prompt token `position` of trace block `hash_id` for the live requests: a fixed
    function of both, so equal ids give equal blocks there too (as REFERENCE §7 asks)."""
    x = (hash_id * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 29
    return 100 + x % 20_000


def live_prompt(item: TraceRequest) -> list[int]:
    tokens = [_token(h, p) for h in item.hash_ids for p in range(TBS)]
    return tokens[: item.input_length]


def pass_intervals(trace: list[TraceRequest], config: EngineConfig) -> list[tuple[float, float]]:
    """The (start, end) of every pass of one engine running the trace on the virtual clock,
    arrivals applied as replay applies them."""
    core = EngineCore(config)
    builder = PromptBuilder(config.block_size, TBS, config.vocab_size, config.seed)
    passes: list[tuple[float, float]] = []
    now, i = 0.0, 0
    while i < len(trace) or core.has_unfinished_requests():
        busy = core.has_unfinished_requests()
        if i < len(trace) and (not busy or trace[i].arrival <= now):
            item = trace[i]
            now = now if busy else max(now, item.arrival)
            tokens, hashes = builder.prompt(item)
            sampling = SamplingParams(max_tokens=item.output_length, ignore_eos=True)
            core.add_request(EngineRequest(f"r{i}", tokens, sampling, item.arrival,
                                           block_hashes=hashes))  # fmt: skip
            i += 1
            continue
        result = core.step(now)
        passes.append((result.start, result.end))
        now = result.end
    return passes


def centred(trace: list[TraceRequest], config: EngineConfig) -> list[TraceRequest]:
    """Each arrival that falls inside a pass moved to that pass's middle. It joins the same
    next pass, so the run is unchanged; but a client's send jitter (and the jitter of the
    request that started the busy period, which anchors the pass grid) can no longer carry
    it across a pass boundary, which would change its TTFT by a whole pass."""
    passes = pass_intervals(trace, config)
    out = []
    for item in trace:
        inside = [(s, e) for s, e in passes if s < item.arrival < e]
        if inside:
            s, e = inside[0]
            item = replace(item, arrival=(s + e) / 2)
        out.append(item)
    return out


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


def test_live_and_replay_agree() -> None:
    config = EngineConfig(**ENGINE)
    spec = SyntheticSpec(num_requests=16, rate=10.0, input_length=320, output_length=12,
                         distribution="uniform", shared_prefix_fraction=0.6, num_prefixes=2,
                         seed=7)  # fmt: skip
    trace = centred(synthetic_trace(spec, TBS), config)
    records = {r.id: r for r in replay(trace, config, trace_block_size=TBS).records}
    assert sum(r.cached_tokens_device for r in records.values()) > 0  # prefixes are shared
    arrivals = {f"r{i}": t.arrival for i, t in enumerate(trace)}
    overlapping = [a for a in records.values() for b in records.values()
                   if a.arrival < arrivals[b.id] < (a.finish or 0)]  # fmt: skip
    assert len(overlapping) > 5  # requests arrive while others run

    app = make_app(**ENGINE)
    engine = app.state.mocker.engines[0]
    finished: dict[str, Request] = {}
    observe = engine.on_step

    def tap(result: StepResult) -> None:
        finished.update((r.request_id, r) for r in result.finished)
        if observe is not None:
            observe(result)

    engine.on_step = tap
    with ServerThread(app) as server:
        asyncio.run(send_live(server.url, trace))
    assert set(finished) == set(records)
    for rid, rec in records.items():
        live = finished[rid]
        assert live.num_cached_tokens == rec.cached_tokens_device + rec.cached_tokens_host, rid
        assert live.first_token_time is not None and rec.ttft is not None
        live_ttft = live.first_token_time - live.arrival_time
        assert abs(live_ttft - rec.ttft) <= 0.1 * rec.ttft + 0.002, (rid, live_ttft, rec.ttft)
