"""Replay a trace through K engine cores on one virtual clock, recording every request."""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from mocker.config import ConfigError, EngineConfig
from mocker.engine.decode_runs import DecodeRuns
from mocker.engine.stats import FinishedRequestStats
from mocker.replay.arrivals import TraceArrivals
from mocker.replay.records import EngineSample, ReplayResult, finished_record
from mocker.replay.router import RoutingPolicy
from mocker.replay.trace import TraceRequest
from mocker.timing import TimingModel

__all__ = ["check_split", "replay"]


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
    check_split(prefill_engines, num_engines)
    if not config.lora.enable_lora:
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


def check_split(prefill_engines: int, num_engines: int) -> None:
    """P/D's split of the engines leaves at least one to decode."""
    if not 0 <= prefill_engines < num_engines or (prefill_engines and num_engines < 2):
        raise ConfigError(
            f"--prefill-engines ({prefill_engines}) must leave at least one of the "
            f"--num-engines ({num_engines}) to decode"
        )


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


class _ReplayRun(TraceArrivals):
    """One replay: K cores on the discrete-event loop, fed by TraceArrivals; rows, samples."""

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
        super().__init__(trace, config, num_engines, router, trace_block_size, concurrency,
                         prefill_engines, timing)  # fmt: skip
        self.clocks = self.loop.clocks
        # When each engine last did something (a pass, or transfers that ended): with P/D,
        # an idle prefill engine's clock may stand at a hold's expiry that a pull forestalled.
        self.active_until = [0.0] * num_engines
        self.num_samples = num_samples
        self.progress = progress
        if concurrency is not None:
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
            result.records.append(finished_record(request, engine, line, lora, prefill))
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
