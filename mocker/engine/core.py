"""EngineCore: the synchronous engine. `step(now)` runs one pass; time is only ever an argument."""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from typing import Any, TypeVar

from mocker.compiled import cpass as _cpass
from mocker.compiled import use_compiled
from mocker.config import EngineConfig
from mocker.disagg.holds import KVHolds
from mocker.disagg.params import RemotePrefill, handoff_params
from mocker.disagg.pulls import PULL_SOURCE, PrefillPeers, PullRecord, RemotePulls
from mocker.engine.intake import (
    RequestRejected,
    check_request,
    request_id_in_use,
    resolve_max_tokens,
)
from mocker.engine.kv_stack import build_kv_stack
from mocker.engine.lora_slots import LoraSlots
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stats import (
    EngineSnapshot,
    FinishedRequestStats,
    SchedulerStats,
    TierSnapshot,
)
from mocker.engine.stopping import draw, stop_status, unmasked
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.events import KVEvent
from mocker.kv.hashing import BlockHash, make_hasher
from mocker.kv.manager import KVCacheManager
from mocker.output_tokens import OutputTokenSampler
from mocker.request import EngineRequest, Request, RequestId, RequestStatus, SamplingParams
from mocker.scheduler.output import SchedulerOutput
from mocker.scheduler.scheduler import Scheduler
from mocker.tiers.connector import TierConnector
from mocker.tiers.link import Link
from mocker.tiers.lru import LruTier
from mocker.tiers.storage import StorageTier
from mocker.tiers.transfers import TransferRecord
from mocker.timing import PassShape, TimingModel, load_timing_model, pass_duration_s

__all__ = ["EngineCore", "RequestRejected"]

_new_output = object.__new__  # (see `_advance`)

T = TypeVar("T")

# A replay's pass draws its tokens as one array from this many sampling requests on: the
# array has a fixed cost that a token drawn alone does not, and breaks even about here.
# Below it a pass draws one at a time.
COLUMN_MIN_REQUESTS = 24


class EngineCore:
    """Owns requests, scheduler, KV manager and timing; mutated only by whoever calls step().

    Callers outside the engine read `snapshot()` and the other read-only views; the pool,
    tiers and scheduler are the engine's own (tests of those parts reach them directly).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        timing: TimingModel | None = None,
        output_palette: Sequence[int] | None = None,
        cpu_tier: LruTier | None = None,
        shared_tiers: Mapping[str, StorageTier] | None = None,
        engine_id: int = 0,
        peers: PrefillPeers | None = None,
    ) -> None:
        """`cpu_tier`: a CPU tier built outside (shared, or inspected by a test);
        `shared_tiers`: secondary tiers shared with other engines (mocker.engine.kv_stack);
        `peers`: how a P/D decode engine reaches prefill engines (the driver may set
        `pulls.peers` later)."""
        self.config = config
        self.timing = timing if timing is not None else load_timing_model(config.timing)
        stack = build_kv_stack(config, self.timing.prefill_ms, cpu=cpu_tier,
                               shared=shared_tiers, engine_id=engine_id)  # fmt: skip
        self.pool, self.kv = stack.pool, stack.kv
        self.cpu: LruTier | None = stack.cpu
        self.connector: TierConnector | None = stack.connector
        # The tiers record KV events (all of them, or none: TierConnector): asked every pass.
        self._tier_events = stack.connector is not None and stack.connector.cpu.record_events
        # P/D (NixlConnector): a prefill engine holds finished requests' KV for pulls; a
        # decode engine pulls prompts' KV over its link.
        scale = config.speedup_ratio
        self.holds: KVHolds | None = None
        if config.kv_role.produces:
            self.holds = KVHolds(config.hold_timeout / scale)
        self.pulls: RemotePulls | None = None
        if config.kv_role.consumes:
            link = Link(config.pull_gbps * 1e9 * scale, config.pull_latency_ms / 1000.0 / scale)
            self.pulls = RemotePulls(link, config.block_bytes, config.pull_timeout / scale, peers,
                                     config.kv_transfer_mode)  # fmt: skip
        # Where a pull reaches this engine (kv_transfer_params' remote_host / remote_port):
        # the driver's side channel sets it.
        self.side_channel: tuple[str, int] = ("localhost", 5600)
        self.scheduler = Scheduler(config, self.kv, self.connector, self.pulls)
        self.scheduler.count_context = self.timing.reads_context
        # A model whose decode passes keep their time over runs of passes says for how long.
        self._decode_span: Callable[[int, int], tuple[float, int]] | None = getattr(
            self.timing, "decode_span", None
        )
        # With --enable-lora: the adapters' GPU slots and CPU cache (a pass waits for its
        # batch's cold adapters to load).
        self.lora: LoraSlots | None = None
        if config.enable_lora:
            scale = 1000.0 * config.speedup_ratio
            self.lora = LoraSlots(
                config.max_loras, config.max_cpu_loras or config.max_loras,
                config.lora_load_ms / scale, config.lora_disk_load_ms / scale,
            )  # fmt: skip
        self.time = 0.0  # the latest time the core was driven to
        # vLLM's algorithms seed their chain with $PYTHONHASHSEED, read once here.
        self.hasher = make_hasher(
            config.prefix_caching_hash_algo, config.seed, os.environ.get("PYTHONHASHSEED")
        )
        self.sampler = OutputTokenSampler(
            output_palette if output_palette is not None else range(config.vocab_size),
            config.eos_token_id,
            config.eos_probability,
            config.seed,
        )
        self.requests: dict[str, Request] = {}
        # False: a pass builds no RequestOutput (a driver that reads only the finished
        # records and the requests' own times: replay); everything else is the same.
        self.emit_outputs = True
        # The timing model's KV tokens are a dense model's: a hybrid model's blocks hold
        # group_size of its num_layers layers each (1 for a dense model).
        layout = config.layout
        self._kv_weight = layout.group_size / layout.num_layers
        self._hybrid: HybridKVCacheManager | None = (
            self.kv if isinstance(self.kv, HybridKVCacheManager) else None
        )
        self.total_kv_tokens = config.num_gpu_blocks * config.block_size
        self._advancer: _cpass.Advancer | None = advancer(
            config.block_size, self.sampler.eos_token_id
        )
        # The scheduler's compiled head asks the manager again for what it was refused.
        kv = self.kv
        if self._advancer is not None and isinstance(kv, KVCacheManager) and kv.quiet_failures:
            self.scheduler.decode_head = self._advancer.decodes

    # -- intake -------------------------------------------------------------------------------

    def check_request(self, spec: EngineRequest, *, ids_in_range: bool = False) -> int:
        """Validate without changing anything (mocker.engine.intake); returns the resolved
        max_tokens."""
        if spec.request_id in self.requests:
            raise request_id_in_use(spec.request_id)
        return check_request(self.config, spec, ids_in_range=ids_in_range)

    def add_request(
        self,
        spec: EngineRequest,
        *,
        checked: bool = False,
        ids_in_range: bool = False,
        handed_over: bool = False,
    ) -> Request:
        """`checked`: the driver validated it already (the live engine does, at its door);
        only max_tokens is resolved again. `ids_in_range`: the driver built the prompt's ids
        (replay), so every other check runs but theirs (mocker.engine.intake).
        `handed_over`: the driver gives the request the spec's lists (the prompt's ids and
        block hashes), keeping no reference it reads again: the request grows them as its
        own instead of copying them (replay builds both afresh for each request; a copy
        of a prompt of 12k ids per request was 2% of a replay)."""
        config = self.config
        max_tokens = (
            resolve_max_tokens(config, spec)
            if checked
            else self.check_request(spec, ids_in_range=ids_in_range)
        )
        prompt = spec.prompt_token_ids
        request = Request(
            request_id=RequestId(spec.request_id),
            all_token_ids=_owned(prompt, handed_over),
            num_prompt_tokens=len(prompt),
            max_tokens=max_tokens,
            sampling=spec.sampling,
            arrival_time=spec.arrival_time,
            priority=spec.priority,
            lora_name=spec.lora_name,
            lora_path=spec.lora_path,
            session_id=spec.session_id,
            report_hits=spec.report_hits,
            token_seed=self.sampler.request_seed(spec.request_id),
            # P/D: a role this engine does not have is ignored, as vLLM's connector would.
            remote_decode=spec.remote_decode and self.holds is not None,
            remote_prefill=spec.remote_prefill if self.pulls is not None else None,
            parent=spec.parent,
            skip_reading_prefix_cache=spec.skip_reading_prefix_cache,
        )
        if self.config.enable_prefix_caching:
            if spec.block_hashes is not None:
                request.block_hashes = _owned(spec.block_hashes, handed_over)
            request.enable_hashing(self.hasher, self.config.block_size, spec.cache_salt)
        self.requests[spec.request_id] = request
        self.scheduler.add(request)
        return request

    def abort_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Abort wherever the request is; its blocks are freed at once. None if unknown."""
        request = self._end(request_id, now, RequestStatus.FINISHED_ABORTED)
        return None if request is None else RequestOutput.final(request, now)

    def stop_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Finish with reason 'stop' (a stop string matched in the detokenized text)."""
        request = self._end(request_id, now, RequestStatus.FINISHED_STOPPED)
        return None if request is None else RequestOutput.final(request, now)

    def finish_request(
        self, request_id: str, now: float, status: RequestStatus
    ) -> FinishedRequestStats | None:
        """End a request outside a pass (abort, stop string); its record for observers."""
        request = self._end(request_id, now, status)
        return None if request is None else FinishedRequestStats.of(request)

    def _end(self, request_id: str, now: float, status: RequestStatus) -> Request | None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        connector, pulls = self.connector, self.pulls
        if pulls is not None and request.remote_prefill is not None:
            # Its pull stops, or never starts: either way the prefill engine frees the KV.
            if not pulls.cancel(now, request):
                pulls.peers.release(request.remote_prefill)
            request.remote_prefill = None
        elif connector is not None:
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                connector.cancel_load(now, request)
            else:
                connector.drop_request(now, request)  # a promotion or a hold it has
        self.scheduler.finish(request, status)
        request.finished_time = now
        return request

    # -- read-only views ----------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def snapshot(self) -> EngineSnapshot:
        """The engine's state now, as gauges and routers read it."""
        return EngineSnapshot(
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            kv_usage=self.pool.usage,
            cpu_usage=self.cpu.usage if self.cpu is not None else 0.0,
            num_unfinished=len(self.requests),
            num_used_blocks=self.pool.num_used,
            lora_adapters=self._lora_adapters() if self.config.enable_lora else (),
            kv_expired=self.holds.num_expired if self.holds is not None else 0,
            kv_fetch=self._kv_fetch() if self.pulls is not None else (0, 0, 0),
            num_deferred=self.scheduler.num_deferred + len(self.scheduler.loading),
            group_usage=tuple(self._hybrid.group_usage()) if self._hybrid is not None else (),
            **self._tier_snapshot(),
        )

    def _kv_fetch(self) -> tuple[int, int, int]:
        """Requests by async KV load stage (vLLM's num_requests_kv_fetch_by_stage): whose
        pull has not started, whose load runs, whose KV landed but who do not run yet."""
        s = self.scheduler
        unstarted = sum(
            1 for r in self.requests.values()
            if r.remote_prefill is not None and r.status != RequestStatus.WAITING_FOR_REMOTE_KVS
        )  # fmt: skip
        return unstarted, len(s.loading), len(s.ready)

    def _lora_adapters(self) -> tuple[str, ...]:
        names = (r.lora_name for r in self.requests.values() if r.lora_name is not None)
        return tuple(dict.fromkeys(names))

    def _tier_snapshot(self) -> dict[str, Any]:
        connector = self.connector
        if connector is None:
            return {}
        jobs = connector.jobs()
        capacity = max(connector.cpu.capacity, 1)
        tiers = tuple(
            TierSnapshot(t.name, t.tier.usage, c.block_queries, c.block_hits,
                         c.promotion_failures, c.cascade_failures, promoting, cascading,
                         written / capacity, read / capacity)
            for t in connector.storage
            for c in (connector.counters[t.name],)
            for promoting, cascading, written, read in (jobs[t.name],)
        )  # fmt: skip
        p = connector.primary
        primary = TierSnapshot("primary", connector.cpu.usage, p.block_queries, p.block_hits)
        reading = sum(len(keys) for _, keys in connector.loads.blocks())
        return {"stores_skipped": connector.stores_skipped, "tiers": tiers,
                "primary": primary if tiers else None,
                "cpu_read_usage": reading / capacity,
                "cpu_write_usage": connector.cpu.num_incoming / capacity}  # fmt: skip

    def num_cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of these hashes the device prefix cache holds."""
        if self._hybrid is not None:
            return self._hybrid.find_hit_blocks(block_hashes, len(block_hashes))
        return self.pool.num_cached_prefix(block_hashes)

    def has_pending_transfers(self) -> bool:
        """Transfers in flight, or KV held for a pull until a lease ends: the core needs
        driving until they end."""
        return (
            (self.connector is not None and self.connector.has_pending)
            or bool(self.pulls)
            # A hold that can expire (a claimed one waits for another engine's pull).
            or (self.holds is not None and self.holds.next_deadline() is not None)
        )

    def next_transfer_deadline(self) -> float | None:
        """When a transfer next ends, a load or pull times out, a posted store starts or a
        hold expires (None: nothing in flight)."""
        deadline = None if self.connector is None else self.connector.next_deadline()
        for part in (self.pulls, self.holds):
            if part:
                d = part.next_deadline()
                if d is not None and (deadline is None or d < deadline):
                    deadline = d
        return deadline

    def waits_on_peers(self) -> bool:
        """KV held for other engines' pulls: what frees it happens there (P/D)."""
        return bool(self.holds)

    @property
    def has_transfer_parts(self) -> bool:
        """Tiers or P/D: a live driver needs a transfer timer."""
        return self.connector is not None or self.pulls is not None or self.holds is not None

    @property
    def has_tier_news(self) -> bool:
        """Transfer records or tier events that another engine's poll left for this one
        (a tier shared with it), waiting for its next step or `advance_transfers`."""
        return self.connector is not None and self.connector.has_news

    @property
    def transfer_version(self) -> int:
        """Changes whenever a transfer, pull or hold starts or ends (the timer re-arms)."""
        return sum(p.version for p in (self.connector, self.pulls, self.holds) if p is not None)

    def stall_error(self) -> RuntimeError:
        """What a driver raises when a pass scheduled nothing although requests remain (a bug:
        every admitted request fits the pool, and running requests preempt others for room)."""
        return RuntimeError(
            f"engine stalled: {len(self.requests)} unfinished requests, none schedulable"
        )

    # -- results without a pass ---------------------------------------------------------------

    def advance_transfers(self, now: float) -> StepResult:
        """Apply the transfers due by `now` without running a pass (an idle result)."""
        self.time = max(self.time, now)
        records = self._poll_transfers(now)
        pulled = self._poll_pd(now)
        return StepResult(now, now, [], self._stats(), [], self._take_events(), records, pulled)

    def reset_prefix_cache(
        self, now: float, *, whole: bool = False, reset_running: bool = False
    ) -> tuple[int | None, StepResult]:
        """Clear the device prefix cache of blocks nobody references; returns the number
        cleared and an idle result carrying the events: AllBlocksCleared, then BlockStored for
        what every tier still holds. `whole`: vLLM 0.34's reset, refused (None) while any
        block is referenced; `reset_running` preempts the running requests first (they
        recompute)."""
        self.time = max(self.time, now)
        preempted = self.scheduler.preempt_running() if reset_running else None
        if whole and self.pool.num_used:
            return None, StepResult(now, now, [], self._stats(preempted), [], [], [])
        pending = self._take_events()  # recorded before the reset: they go out first
        cleared = self.pool.reset_prefix_cache()
        if self.connector is not None:
            self.connector.announce()
        events = pending + self._take_events()
        return cleared, StepResult(now, now, [], self._stats(preempted), [], events, [])

    def _poll_pd(self, now: float) -> list[PullRecord]:
        """Pulls that ended (KV landed, or failed: recompute) and holds that expired."""
        if self.holds:
            for request in self.holds.expire(now):
                self.scheduler.free_finished(request)
        pulls = self.pulls
        if not pulls:
            return []
        loaded, failed = pulls.poll(now)
        for request in loaded:
            request.remote_prefill = None
            self.kv.finish_pull(request)
            self.scheduler.resume(request)
        for request in failed:
            request.remote_prefill = None  # vLLM's kv_load_failure_policy "recompute"
            self.kv.free(request)
            if request.num_cached_tokens < 0:
                request.tier_hits = ()
            self.scheduler.requeue(request)
        records = pulls.take_records()
        for record in records:
            pulled = self.requests.get(record.request_id)
            if pulled is not None:
                pulled.pull_time += record.duration
        return records

    def _poll_transfers(self, now: float) -> list[TransferRecord]:
        connector = self.connector
        if connector is None:
            return []
        loaded, timed_out = connector.poll(now)
        for request in loaded:
            # The loaded blocks are in the CPU tier (pinned while read): nothing to store.
            self.kv.finish_load(request)
            self.scheduler.resume(request)
        for request in timed_out:
            self.kv.free(request)  # its load was cancelled: recompute, never load again
            request.skip_tier_load = True
            self.scheduler.requeue(request)
        return connector.take_records()

    def _take_events(self) -> list[KVEvent]:
        events = self.pool.take_events()
        if self._tier_events:
            tier_events = self.connector.take_events()  # type: ignore[union-attr]
            if tier_events:
                events = events + tier_events
        return events

    def _stats(
        self, sched: SchedulerOutput | None = None, num_generated: int = 0
    ) -> SchedulerStats:
        s = self.scheduler
        return SchedulerStats.of(
            len(s.running), s.num_waiting, self.pool.usage, sched, num_generated
        )

    # -- the pass -----------------------------------------------------------------------------

    def pass_duration(
        self,
        prefill_tokens: int,
        num_decodes: int,
        num_used_blocks: int,
        *,
        prefill_requests: int,
        prefill_context: int,
        decode_context: int,
    ) -> float:
        """Simulated seconds of a pass of this composition (the speedup ratio applied); the
        context counts are `SchedulerOutput`'s.

        A hybrid model's attention reads only its attention groups' blocks (a sliding
        window's few, Mamba states none that grow with context): `num_used_blocks` is
        replaced by those, and both KV token counts are in whole-model layers:
        active = (group_size / num_layers) × block_size × Σ attention groups' used blocks,
        total = (group_size / num_layers) × block_size × num_gpu_blocks."""
        if self._hybrid is not None:
            num_used_blocks = self._hybrid.attention_blocks()
            w = self._kv_weight
            active = round(num_used_blocks * self.config.block_size * w)
            total = round(self.total_kv_tokens * w)
        else:
            active = num_used_blocks * self.config.block_size
            total = self.total_kv_tokens
        shape = PassShape(prefill_tokens, prefill_requests, prefill_context, num_decodes,
                          decode_context, active, total)  # fmt: skip
        return pass_duration_s(self.timing, shape, self.config.speedup_ratio)

    def decode_pass(
        self, num_decodes: int, num_used_blocks: int, decode_context: int
    ) -> tuple[float, int]:
        """`pass_duration` of a pass of decodes only, and for how many passes from it on (each
        reading num_decodes more tokens, nothing else changed) it stays the same: the timing
        model's `decode_span` if it has one (the GPU model's memoised steps), else 1."""
        span_of = self._decode_span
        if span_of is None or self._hybrid is not None:
            seconds = self.pass_duration(
                0, num_decodes, num_used_blocks,
                prefill_requests=0, prefill_context=0, decode_context=decode_context,
            )  # fmt: skip
            return seconds, 1
        ms, span = span_of(num_decodes, decode_context)
        return ms / 1000.0 / self.config.speedup_ratio, span

    def scheduled_duration(self, sched: SchedulerOutput) -> float:
        """`pass_duration` of a scheduled pass, with the pool as it now is."""
        return self.pass_duration(
            sched.num_prefill_tokens,
            sched.num_decodes,
            self.pool.num_used,
            prefill_requests=sched.prefill_requests,
            prefill_context=sched.prefill_context,
            decode_context=sched.decode_context,
        )

    def step(self, now: float) -> StepResult:
        """Schedule one pass starting at `now`, advance every scheduled request to its end.

        Transfers due by `now` are applied first. The returned result's `end` is when
        the pass's tokens exist; a driver delivers them no earlier than that. A result
        that is `idle` ran no pass (everything waits for transfers, or nothing is left).
        """
        self.time = max(self.time, now)
        records = self._poll_transfers(now)
        pulled = self._poll_pd(now)
        sched = self.scheduler.schedule()
        connector = self.connector
        if connector is not None:
            connector.scheduled(now, sched.loads)
        if sched.pulls:
            self._start_pulls(now, sched.pulls)
        end = now + self.scheduled_duration(sched)
        if self.lora is not None:
            wait = self.lora.activate(
                r.lora_name for r in sched.num_scheduled if r.lora_name is not None
            )
            if wait:  # the whole pass waits: every request in it
                end += wait
                for request in sched.num_scheduled:
                    request.lora_wait += wait
        _first_scheduled(sched.admitted, now)
        outputs, finished, generated = self._advance(sched, end)
        if connector is not None:
            connector.policy.end_pass(end)
        stats = self._stats(sched, generated)
        return StepResult(now, end, outputs, stats, finished, self._take_events(), records,
                          pulled)  # fmt: skip

    def end_pass(
        self, sched: SchedulerOutput, now: float, end: float
    ) -> list[FinishedRequestStats]:
        """Apply a pass scheduled outside `step()` (a replay's run, `decode_runs`) that ran
        from `now` to `end`, as `step()` applies one: what it admitted is stamped, what it
        scheduled advanced. The finished requests' stats (no outputs: replay only). Only for
        an engine without tiers or P/D legs, whose hooks only `step()` runs."""
        self.time = max(self.time, now)
        _first_scheduled(sched.admitted, now)
        return self._advance(sched, end)[1]

    def _start_pulls(self, now: float, pulls: list[tuple[Request, int]]) -> None:
        assert self.pulls is not None
        for request, num_blocks in pulls:
            if request.num_cached_tokens < 0:  # counted once, when it resumes
                request.tier_hits = ((PULL_SOURCE, request.load_hits[1]),)
            self.pulls.start(now, request, num_blocks)

    def _cache_computed(self, request: Request) -> None:
        """Register the request's newly full blocks, and tell the store policy (write-through
        pins the new full prompt blocks for their copy now, before the request can finish
        and free them)."""
        before = request.num_cached_blocks
        self.kv.cache_blocks(request)
        if self.connector is not None:
            self.connector.policy.on_cached(request, before)

    def _advance(
        self, sched: SchedulerOutput, end: float
    ) -> tuple[list[RequestOutput], list[FinishedRequestStats], int]:
        """Apply the pass: computed tokens, newly full blocks cached, one token per completion.
        Returns the outputs (none when `emit_outputs` is off), the finished requests' stats
        and how many tokens were sampled. With the compiled part (mocker/engine/_cpass.c)
        the plain decode tokens are applied in C and the rest by `_advance_one`, which
        applies every request without it (the reference)."""
        outputs: list[RequestOutput] = []
        finished: list[FinishedRequestStats] = []
        emit = self.emit_outputs
        column = None if emit else self._pass_tokens(sched)
        # Blocks registered as they were scheduled: the store policy hears of them now that
        # they are computed (without tiers, nothing is left to do for them).
        registered = sched.registered if self.connector is not None else None
        scheduled = sched.num_scheduled

        def one(request: Request, n: int) -> int:
            return self._advance_one(request, n, end, column, registered, outputs, finished)

        if self._advancer is not None:
            partial = self._advancer.run(scheduled, end, emit, column, registered,
                                         self.sampler.token, self._cache_computed, outputs,
                                         one)  # fmt: skip
        else:
            partial = sum(map(one, scheduled, scheduled.values()))
        if finished:
            self.scheduler.remove_finished()
        return outputs, finished, len(scheduled) - partial

    def _advance_one(
        self,
        request: Request,
        n: int,
        end: float,
        column: list[int] | None,
        registered: dict[Request, int] | None,
        outputs: list[RequestOutput],
        finished: list[FinishedRequestStats],
    ) -> int:
        """One scheduled request of a pass ending at `end` (`_advance`): its output to
        `outputs` (when emitting), its record to `finished` if it ended. 1 if it is a
        prefill chunk short of its prompt's end (it samples nothing), else 0."""
        computed = request.num_computed_tokens + n
        request.num_computed_tokens = computed
        if registered is not None and request in registered:
            self.connector.policy.on_cached(request, registered[request])  # type: ignore[union-attr]
        elif computed // self.config.block_size > request.num_cached_blocks:
            self._cache_computed(request)
        tokens = request.all_token_ids
        num_tokens = len(tokens)
        if computed < num_tokens:
            return 1  # a prefill chunk that does not reach the end of the prompt
        sampler = self.sampler
        eos = sampler.eos_token_id
        k = num_tokens - request.num_prompt_tokens  # index of the token sampled now
        sp = request.sampling
        emit = self.emit_outputs
        if emit:  # token k: drawn ahead, or drawn now (stopping.draw)
            drawn, j = request.drawn, k - request.drawn_from
            tok = drawn[j] if drawn and 0 <= j < len(drawn) else draw(sampler, request, k)
        elif column is not None:  # a replay's pass, its tokens drawn as one array
            tok = column.pop()
        else:
            # A replay: its decode runs draw their own tokens, which would leave most of
            # a draw ahead unread, wasted work: this pass's token only.
            tok = sampler.token(request.token_seed, k, not sp.ignore_eos and k >= sp.min_tokens)
        if k < sp.min_tokens and tok in sp.stop_token_ids:
            tok = unmasked(sampler, request, k)
        # Request.append_output_token, inlined (once per generated token).
        tokens.append(tok)
        chain = request.hash_chain
        if chain is not None and len(tokens) % request.hash_block_size == 0:
            chain.extend(request.block_hashes, tokens, request.hash_block_size)
        first = request.first_token_time is None
        if first:
            request.first_token_time = end
            latency = end - request.arrival_time
        else:
            latency = end - request.last_token_time
        request.last_token_time = end
        # Nearly every token ends nothing: below the cap, not EOS, no stop ids to check.
        if k + 1 < request.max_tokens and tok != eos and not sp.stop_token_ids:
            status = None
        else:
            status = stop_status(request, tok, k + 1, eos)
        if status is not None:  # (finishing changes nothing the output reads)
            finished.append(self.finish_in_pass(request, status, end))
        if not emit:
            return 0
        # RequestOutput(...), every field set here: its `__init__` is called through the
        # generic type call (~1.1k instructions more per streamed token on 3.11).
        out = _new_output(RequestOutput)
        out.request_id = request.request_id
        out.new_token_ids = [tok]
        out.time = end
        out.finished = False
        out.finish_reason = None
        out.num_prompt_tokens = request.num_prompt_tokens
        out.num_cached_tokens = request.num_cached_tokens
        out.tier_hits = request.tier_hits
        out.first_token = first
        out.latency = latency
        out.kv_transfer_params = None
        if status is not None:
            out.finished = True
            out.finish_reason = request.finish_reason
            if request.remote_decode and self.holds is not None:
                out.kv_transfer_params = self._handoff(request)
        outputs.append(out)
        return 0

    def _pass_tokens(self, sched: SchedulerOutput) -> list[int] | None:
        """A replay's pass with many requests sampling, none of which can draw EOS: their
        tokens, `sampler.token(seed, k, False)` each, drawn as one array and listed last
        first (`_advance` pops them in its order). None: drawn one at a time (a small pass
        costs the array more than it saves; EOS possible)."""
        scheduled = sched.num_scheduled
        if len(scheduled) < COLUMN_MIN_REQUESTS:
            return None
        early = self.sampler.can_end_early
        seeds: list[int] = []
        indexes: list[int] = []
        for request, n in scheduled.items():
            num_tokens = len(request.all_token_ids)
            if request.num_computed_tokens + n < num_tokens:
                continue  # a prefill chunk short of the prompt's end samples nothing
            k = num_tokens - request.num_prompt_tokens
            sp = request.sampling
            if early and not sp.ignore_eos and k >= sp.min_tokens:
                return None
            seeds.append(request.token_seed)
            indexes.append(k)
        if len(seeds) < COLUMN_MIN_REQUESTS:
            return None
        column = self.sampler.token_column(seeds, indexes)
        column.reverse()
        return column

    def finish_in_pass(
        self, request: Request, status: RequestStatus, end: float
    ) -> FinishedRequestStats:
        """A request reached its end in a pass ending at `end` (the caller drops it from
        the running list once the pass is applied)."""
        request.status = status
        request.finished_time = end
        request.drawn = None  # (a P/D hold keeps the request a while)
        holds = self.holds
        if holds is not None and request.remote_decode and request.blocks:
            # P/D prefill side: the blocks stay referenced until a decode engine has pulled
            # them or the hold expires (vLLM's delay_free_blocks).
            holds.hold(request, end)
        else:
            self.scheduler.free_finished(request)
        del self.requests[request.request_id]
        return FinishedRequestStats.of(request)

    def release_hold(self, hold_id: str) -> bool:
        """A decode engine has read a held request's KV (or gave up on it): free its blocks.
        False if nothing was held under that id (the hold expired, or never was)."""
        request = None if self.holds is None else self.holds.release(hold_id)
        if request is None:
            return False
        self.scheduler.free_finished(request)
        return True

    def extend_holds(self, hold_ids: Sequence[str], now: float) -> int:
        """A decode engine's heartbeat for the holds it still wants: each lease runs on for
        two thirds of its length from `now` (vLLM's kv_lease_duration * 2 // 3). How many of
        them this engine still holds."""
        holds = self.holds
        if holds is None:
            return 0
        until = now + holds.timeout * 2 / 3
        return sum(holds.extend(hold_id, until) for hold_id in hold_ids)

    def claim_hold(self, hold_id: str) -> bool:
        """The hold lasts until released (a driver whose decode engines never die: replay,
        where heartbeats would keep every claimed lease alive)."""
        return self.holds is not None and self.holds.extend(hold_id, math.inf)

    def remote_sources(self) -> list[RemotePrefill]:
        """P/D decode side: the prefill engines' holds this engine's requests still want
        (waiting for their pull, or pulling): what its heartbeats name."""
        return [r.remote_prefill for r in self.requests.values() if r.remote_prefill is not None]

    def held_params(self, request_id: str) -> dict[str, Any] | None:
        """The kv_transfer_params of a request this engine holds for a pull (None: none)."""
        if self.holds is None:
            return None
        hold_id = self.holds.hold_id_of(request_id)
        request = None if hold_id is None else self.holds.request(hold_id)
        return None if request is None else self._handoff(request)

    def _handoff(self, request: Request) -> dict[str, Any] | None:
        """The kv_transfer_params a held request answers with, naming where its KV is (the
        fields of vLLM's NixlConnector.request_finished); None if it is not held."""
        hold_id = None if self.holds is None else self.holds.hold_id_of(request.request_id)
        if hold_id is None:
            return None
        host, port = self.side_channel
        return handoff_params(self.config, hold_id, host, port, blocks=request.blocks,
                              num_computed_tokens=request.num_computed_tokens,
                              num_cached_tokens=request.num_cached_tokens)  # fmt: skip


def advancer(
    block_size: int, eos_token_id: int | None, compiled: bool | None = None
) -> _cpass.Advancer | None:
    """The compiled part that applies a pass's plain decode tokens (mocker/engine/_cpass.c),
    or None when `EngineCore._advance_one` applies every request (not built,
    MOCKER_COMPILED=0, or `compiled=False`)."""
    if not use_compiled("mocker.engine._cpass", compiled):
        return None
    return _cpass.Advancer(Request, SamplingParams, RequestOutput, block_size, eos_token_id)


def _first_scheduled(admitted: list[Request], now: float) -> None:
    """Requests admitted in a pass starting at `now`: scheduled first then, unless before."""
    for request in admitted:
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now


def _owned(items: Sequence[T], handed_over: bool) -> MutableSequence[T]:
    """The request's own list of these: the list (or replay's array) itself when the driver
    hands it over (see `EngineCore.add_request`), else a copy (a tuple, or one the driver
    keeps; an array stays one)."""
    if isinstance(items, array):
        return items if handed_over else array(items.typecode, items)
    return items if handed_over and type(items) is list else list(items)
