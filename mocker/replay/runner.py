"""Replay a trace through K engine cores on one virtual clock, recording every request."""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from mocker.config import ConfigError, EngineConfig, KVRole
from mocker.disagg.local_peers import LocalPeers
from mocker.disagg.params import RemotePrefill, parse_transfer_params
from mocker.engine.core import EngineCore
from mocker.engine.decode_runs import DecodeRuns
from mocker.engine.event_loop import EventLoop
from mocker.engine.intake import RequestRejected, check_prompt_length
from mocker.engine.kv_stack import build_shared_tiers
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.hashing import BlockHashes
from mocker.replay.prompts import PromptBuilder, adapter_hashes
from mocker.replay.router import RoutingPolicy, make_router
from mocker.replay.trace import TraceRequest
from mocker.request import EngineRequest, SamplingParams, TokenIds
from mocker.tiers.transfers import TransferKind, TransferRecord
from mocker.timing import TimingModel

__all__ = ["EngineSample", "ReplayResult", "RequestRecord", "replay"]

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One row of requests.jsonl (times in seconds of simulated time)."""

    id: str
    line: int
    engine: int
    status: str  # "finished", or "rejected: <why>"
    arrival: float
    input_tokens: int
    output_tokens: int
    admit: float | None = None
    first_token: float | None = None
    finish: float | None = None
    ttft: float | None = None
    mean_itl: float | None = None
    e2e: float | None = None
    cached_tokens_device: int = 0
    # Of the prefix hits, the tokens loaded from each tier below the device (by name).
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    lora: str | None = None  # the adapter the trace row names
    lora_wait: float = 0.0  # seconds its passes waited for LoRA adapters to load
    # P/D (--prefill-engines): the engine that computed its prompt (`engine` decoded it),
    # and the seconds its KV took to pull from there.
    prefill_engine: int | None = None
    pull_time: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineSample:
    time: float
    engine: int
    kv_usage: float
    cpu_usage: float
    running: int
    waiting: int
    group_usage: tuple[float, ...] = ()  # hybrid models: per KV cache group


@dataclass(slots=True)
class ReplayResult:
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[EngineSample] = field(default_factory=list)
    cores: list[EngineCore] = field(default_factory=list)
    sim_duration: float = 0.0
    wall_s: float = 0.0
    num_steps: int = 0
    # Device ↔ CPU transfer bytes, from the transfer records (as the metrics count them),
    # and the bytes of every link, keyed "src->dst" (e.g. "cpu->fs").
    store_bytes: int = 0
    load_bytes: int = 0
    link_bytes: dict[str, int] = field(default_factory=dict)

    def count_transfers(self, records: list[TransferRecord]) -> None:
        for record in records:
            if not record.ok:
                continue  # (a failed promotion moved nothing)
            key = f"{record.src}->{record.dst}"
            self.link_bytes[key] = self.link_bytes.get(key, 0) + record.nbytes
            if not record.touches_device:
                continue
            if record.kind is TransferKind.STORE:
                self.store_bytes += record.nbytes
            else:
                self.load_bytes += record.nbytes


def _record(
    r: FinishedRequestStats,
    engine: int,
    line: int,
    lora: str | None = None,
    prefill_engine: int | None = None,
) -> RequestRecord:
    return RequestRecord(
        id=r.request_id,
        line=line,
        engine=engine,
        status="finished",
        arrival=r.arrival_time,
        input_tokens=r.num_prompt_tokens,
        output_tokens=r.num_generation_tokens,
        admit=r.first_scheduled_time,
        first_token=r.first_token_time,
        finish=r.finished_time,
        ttft=r.time_to_first_token,
        mean_itl=r.mean_time_per_output_token,
        e2e=r.e2e_latency,
        cached_tokens_device=r.num_device_cached_tokens,
        cached_tokens_by_tier=dict(r.tier_hits),
        preemptions=r.num_preemptions,
        lora=lora,
        lora_wait=r.lora_wait,
        prefill_engine=prefill_engine,
        pull_time=r.pull_time,
    )


def replay(
    trace: Sequence[TraceRequest],
    config: EngineConfig,
    *,
    num_engines: int = 1,
    router: RoutingPolicy | str = RoutingPolicy.ROUND_ROBIN,
    trace_block_size: int = 512,
    num_samples: int = 2000,
    progress: Callable[[int], None] | None = None,
    fast: bool = True,
    concurrency: int | None = None,
    prefill_engines: int = 0,
    timing: TimingModel | None = None,
) -> ReplayResult:
    """Run `trace` (sorted by arrival) to completion. Arrivals are applied at the start of
    the first pass of their engine at or after their time, exactly as the single-engine
    virtual driver does; the engine with the earliest pending pass steps next. `fast=False`
    runs every pass through `EngineCore.step` (the results are the same; tests compare).

    `concurrency` C runs a closed loop instead: the trace's arrival times are ignored, C
    users send its requests in order, each sending its next one the moment its previous one
    finishes (or is rejected), from time 0.

    `prefill_engines` N > 0 splits the engines into N prefill and K - N decode engines (P/D,
    as vLLM's NixlConnector): a request is prefilled on a prefill engine (max_tokens 1),
    then sent, when that ends, to a decode engine, which pulls its KV over its link and
    decodes; its row times it from the trace's arrival.

    `timing`: the engines' timing model, instead of the one `config.timing` names (a
    calibration's trial corrections)."""
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not 0 <= prefill_engines < num_engines or (prefill_engines and num_engines < 2):
        raise ConfigError(
            f"--prefill-engines ({prefill_engines}) must leave at least one of the "
            f"--num-engines ({num_engines}) to decode"
        )
    if not config.enable_lora:
        named = next((t for t in trace if t.lora is not None), None)
        if named is not None:
            raise ConfigError(
                f"trace line {named.line} names the LoRA adapter {named.lora!r}: replay it "
                "with --enable-lora (and --max-loras)"
            )
    with _no_automatic_gc():
        run = _ReplayRun(trace, config, num_engines, router, trace_block_size, num_samples,
                         progress, concurrency, prefill_engines, timing)  # fmt: skip
        return run.run(fast)


@contextmanager
def _no_automatic_gc() -> Iterator[None]:
    """The cyclic collector paused for a replay (restored after it, as it was).

    A replay makes no cyclic garbage as it goes (tests/replay/test_runner.py counts it:
    the same handful of objects at the end, whatever the trace's length), so collections
    would find nothing; yet each one walks every young container, and every full one the
    pool's blocks too: 3.7% of the instructions of the trace's first 1,200 requests
    (callgrind)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cores(
    config: EngineConfig, num_engines: int, prefill_engines: int, timing: TimingModel | None
) -> list[EngineCore]:
    """The engines, sharing one `obj` tier as one process's engines do; with P/D, the first
    `prefill_engines` are NixlConnector producers and the rest consumers pulling from them."""
    shared = build_shared_tiers(config)
    if not prefill_engines:
        return [EngineCore(config, timing=timing, shared_tiers=shared, engine_id=k)
                for k in range(num_engines)]  # fmt: skip
    producers: dict[str, EngineCore] = {}
    cores = []
    for k in range(num_engines):
        prefill = k < prefill_engines
        role = KVRole.PRODUCER if prefill else KVRole.CONSUMER
        name = f"{'prefill' if prefill else 'decode'}-{k}"
        engine_config = config.with_changes(kv_role=role, kv_engine_id=name)
        core = EngineCore(engine_config, timing=timing, shared_tiers=shared, engine_id=k,
                          peers=None if prefill else LocalPeers(producers))  # fmt: skip
        if prefill:
            producers[name] = core
        cores.append(core)
    return cores


class _ReplayRun:
    """One replay: K cores on the discrete-event loop (mocker.engine.event_loop), which this
    feeds as its `Arrivals` (the trace cursor, routing, closed-loop users); rows, samples."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        config: EngineConfig,
        num_engines: int,
        router: RoutingPolicy | str,
        trace_block_size: int,
        num_samples: int,
        progress: Callable[[int], None] | None,
        concurrency: int | None,
        prefill_engines: int = 0,
        timing: TimingModel | None = None,
    ) -> None:
        self.started = time.perf_counter()
        self.trace = trace
        self.cores = _cores(config, num_engines, prefill_engines, timing)
        for core in self.cores:
            core.emit_outputs = False  # rows and samples come from the requests themselves
        self.num_prefill = prefill_engines
        self.max_model_len = config.max_model_len
        self.loop = EventLoop(self.cores, self)
        self.clocks = self.loop.clocks
        self.pick = make_router(router).pick
        # P/D: the decode pool's router, and the decode legs due: (time, order, request id,
        # where its KV is), a heap; each request's prompt until its decode leg is sent.
        self.pick_decode = make_router(router).pick
        self.legs: list[tuple[float, int, str, RemotePrefill | None]] = []
        self.num_legs = 0
        self.prompts: dict[str, tuple[TraceRequest, TokenIds, BlockHashes]] = {}
        self.prefilled_on: dict[str, int] = {}
        # When each engine last did something (a pass, or transfers that ended): with P/D,
        # an idle prefill engine's clock may stand at a hold's expiry that a pull forestalled.
        self.active_until = [0.0] * num_engines
        self.builder = PromptBuilder(
            config.block_size, trace_block_size, config.vocab_size, config.seed
        )
        self.result = ReplayResult(cores=self.cores)
        # request id -> (trace line, engine, adapter)
        self.lines: dict[str, tuple[int, int, str | None]] = {}
        self.num_samples = num_samples
        self.progress = progress
        # Closed loop: when each idle user sends next (a heap; C zeros at the start).
        self.free_users: list[float] | None = None
        if concurrency is not None:
            # (More users than requests would only wait: none is made.)
            self.free_users = [0.0] * min(concurrency, len(trace))
            # The span is unknown ahead: sample finely, halving the samples as they pile up.
            self.sample_every = 1e-3
        else:
            span = trace[-1].arrival if trace else 0.0
            self.sample_every = max(span / max(1, num_samples), 1e-9)
        self.next_sample = [0.0] * num_engines
        # Each engine's fast path: open loop without P/D, a finish hands nothing on, and a
        # run goes on through it.
        through = concurrency is None and not prefill_engines
        self.runs = [DecodeRuns(core, through_finishes=through) for core in self.cores]
        self.i = 0  # the next trace request
        self.finished_count = 0

    def run(self, fast: bool) -> ReplayResult:
        # Every busy engine has run the passes that start before an arrival when it is
        # applied: routing sees the state then, and no later finish can free a user earlier.
        loop, result = self.loop, self.result
        loop.fast = self._decode_run if fast else None
        for k, step in loop.run():
            result.count_transfers(step.transfers)
            self.active_until[k] = max(self.active_until[k], step.end)
            if not step.idle:
                result.num_steps += 1
                self._collect(k, step.finished, step.end)
        return self._finish()

    def next_time(self) -> float | None:
        """The Arrivals protocol: the next trace request's arrival, or decode leg."""
        t = self._next_arrival()
        if self.legs:
            leg = self.legs[0][0]
            t = leg if t is None else min(t, leg)
        return t

    def apply(self, now: float) -> None:
        if self.legs and self.legs[0][0] <= now:
            _, _, rid, remote = heapq.heappop(self.legs)
            self._send_decode(rid, remote, now)
        else:
            self._arrive(now)

    def _next_arrival(self) -> float | None:
        if self.i >= len(self.trace):
            return None
        if self.free_users is None:
            return self.trace[self.i].arrival
        # The next user to become free; none is when all wait for their requests.
        return self.free_users[0] if self.free_users else None

    def _arrive(self, arrival: float) -> None:
        """Route trace request i, arriving at `arrival`, and hand it to its engine."""
        item = self.trace[self.i]
        if self.free_users is not None:
            heapq.heappop(self.free_users)
            item = replace(item, arrival=arrival)
        rid = f"r{self.i}"
        self.i += 1
        if item.input_length >= self.max_model_len:
            # Refused as the engine refuses it, before a prompt of that length is built.
            try:
                check_prompt_length(self.cores[0].config, item.input_length)
            except RequestRejected as exc:
                self._rejected(rid, item, 0, exc)
            return
        tokens, hashes = self.builder.prompt(item)
        if item.lora is not None:  # an adapter's blocks are its own: no prefix crosses
            hashes = adapter_hashes(hashes, item.lora)
        pd = self.num_prefill > 0
        pool = self.cores[: self.num_prefill] if pd else self.cores
        target = self.pick(pool, hashes)
        core = self.cores[target]
        self.loop.wake(target, item.arrival)
        # P/D: the prefill leg, as vllm-router sends it (max_tokens 1, do_remote_decode).
        sampling = SamplingParams(max_tokens=1 if pd else item.output_length, ignore_eos=True)
        spec = EngineRequest(rid, tokens, sampling, item.arrival, lora_name=item.lora,
                             lora_path=item.lora, block_hashes=hashes,
                             remote_decode=pd)  # fmt: skip
        try:
            # (The builder's ids, see prompts.py; its lists are the request's own, but a P/D
            # decode leg is sent the same ones later.)
            core.add_request(spec, ids_in_range=True, handed_over=not pd)
        except RequestRejected as exc:
            self._rejected(rid, item, target, exc)
            return
        self.lines[rid] = (item.line, target, item.lora)
        if pd:
            self.prompts[rid] = (item, tokens, hashes)

    def _rejected(self, rid: str, item: TraceRequest, engine: int, exc: RequestRejected) -> None:
        """A request its engine refused: its row, and its user free again at once."""
        self.result.records.append(
            RequestRecord(
                id=rid,
                line=item.line,
                engine=engine,
                status=f"rejected: {exc}",
                arrival=item.arrival,
                input_tokens=item.input_length,
                output_tokens=0,
                lora=item.lora,
            )
        )
        self.finished_count += 1
        if self.free_users is not None:
            heapq.heappush(self.free_users, item.arrival)

    def _send_decode(self, rid: str, remote: RemotePrefill | None, now: float) -> None:
        """P/D: the decode leg of a prefilled request, sent when its prefill ended."""
        item, tokens, hashes = self.prompts.pop(rid)
        n = self.num_prefill
        target = n + self.pick_decode(self.cores[n:], hashes)
        self.loop.wake(target, now)
        sampling = SamplingParams(max_tokens=item.output_length, ignore_eos=True)
        # Timed from the trace's arrival: its TTFT covers prefill, pull and first decode.
        spec = EngineRequest(rid, tokens, sampling, item.arrival, lora_name=item.lora,
                             lora_path=item.lora, block_hashes=hashes,
                             remote_prefill=remote)  # fmt: skip
        # Its prefill engine took it: the decode engine does too (the same configuration).
        self.cores[target].add_request(spec, ids_in_range=True, handed_over=True)  # (last use)
        if remote is not None:
            # Its heartbeats keep the lease alive while it waits (decode engines never die
            # here): the hold lasts until its pull, however long the queue.
            self.cores[self.prefilled_on[rid]].claim_hold(remote.request_id)
        self.lines[rid] = (item.line, target, item.lora)

    def _prefilled(self, k: int, request: FinishedRequestStats) -> None:
        """P/D: a prefill leg ended; its decode leg is due now (what the prefill answered)."""
        params = self.cores[k].held_params(request.request_id)
        # None: nothing held (vLLM answers no params): the decode engine computes it all.
        remote = parse_transfer_params(params)[1] if params is not None else None
        self.prefilled_on[request.request_id] = k
        heapq.heappush(self.legs, (request.finished_time, self.num_legs,
                                   request.request_id, remote))  # fmt: skip
        self.num_legs += 1

    def _decode_run(self, k: int, arrival: float) -> bool:
        """Runs of pure decode passes at once, up to the next arrival (routing reads every
        engine's state then) or sample: the same passes, one call. False: none to run."""
        stop_at = min(arrival, self.next_sample[k])
        loop = self.loop
        # P/D: a prefill engine's next pass sends its decode legs (not yet in `arrival`)
        # when it ends: after its clock, or, parked until a pull frees its KV, after
        # whatever other engine acts next. Closed loop: a finish elsewhere sends a request
        # no earlier than that engine's next pass ends, after its next event.
        closed = self.free_users is not None
        senders = [] if closed else [j for j in range(self.num_prefill) if j != k]
        if closed or any(loop.parked(j) for j in senders):
            senders = [j for j in range(len(self.cores)) if j != k]
        if senders:  # stop before any such moment
            stop_at = min(stop_at, loop.next_engine_of(senders)[1])
        run = self.runs[k].run(self.clocks[k], stop_at)
        if run is None:
            return False
        self.result.num_steps += run.passes
        self.clocks[k] = self.active_until[k] = run.end
        self._collect(k, run.finished, run.end)
        return True

    def _collect(self, k: int, finished: list[FinishedRequestStats], end: float) -> None:
        """After a pass of engine k ending at `end`: rows of finished requests, a sample."""
        result, free_users = self.result, self.free_users
        for request in finished:
            line, engine, lora = self.lines.pop(request.request_id)
            if k < self.num_prefill:
                self._prefilled(k, request)
                continue
            prefill = self.prefilled_on.pop(request.request_id, None)
            result.records.append(_record(request, engine, line, lora, prefill))
            self.finished_count += 1
            if free_users is not None:
                heapq.heappush(free_users, request.finished_time)
        if free_users is not None and len(result.samples) >= 2 * self.num_samples:
            del result.samples[1::2]
            self.sample_every *= 2
        if end >= self.next_sample[k]:
            self.next_sample[k] = end + self.sample_every
            snap = self.cores[k].snapshot()
            result.samples.append(
                EngineSample(
                    end,
                    k,
                    snap.kv_usage,
                    snap.cpu_usage,
                    snap.num_running,
                    snap.num_waiting,
                    snap.group_usage,
                )
            )
        if self.progress is not None and finished:
            self.progress(self.finished_count)

    def _finish(self) -> ReplayResult:
        assert not self.legs and not self.prompts, "P/D legs left unsent"
        for runs in self.runs:
            runs.settle()  # (every request has finished: nothing is left to apply)
        result = self.result
        # A copy on a tier shared with other engines ends in whichever engine's poll reaches
        # its end first, and its record waits in its own engine's connector for that
        # engine's next step: none comes after its last request.
        for core in self.cores:
            if core.connector is not None:
                result.count_transfers(core.connector.take_records())
        if self.progress is not None:
            self.progress(self.finished_count)
        result.records.sort(key=lambda r: int(r.id[1:]))
        result.samples.sort(key=lambda s: (s.time, s.engine))  # engines step in any order
        ends = self.active_until if self.num_prefill else self.clocks
        result.sim_duration = max(ends, default=0.0)
        result.wall_s = time.perf_counter() - self.started
        return result
