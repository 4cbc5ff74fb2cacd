"""EngineCore: the synchronous engine. `step(now)` runs one pass; time is only ever an argument."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from mocker.config import EngineConfig, OffloadPolicy
from mocker.engine.outputs import RequestOutput, StepResult, StepStats
from mocker.kv.block_pool import BlockPool
from mocker.kv.events import KVEvent
from mocker.kv.hashing import BlockHasher, extra_keys_bytes
from mocker.kv.manager import KVCacheManager
from mocker.output_tokens import OutputTokenSampler
from mocker.request import EngineRequest, Request, RequestId, RequestStatus
from mocker.scheduler.scheduler import Scheduler, SchedulerOutput
from mocker.tiers.host import HostTier
from mocker.tiers.offload import Direction, OffloadManager, TransferRecord
from mocker.timing import PassShape, TimingModel, load_timing_model, pass_duration_s

__all__ = ["DecodeRun", "EngineCore", "RequestRejected"]


class RequestRejected(ValueError):
    """A request the engine can never serve; the message says why (a client error)."""


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """Passes run by `EngineCore.run_decodes`: when the last ended, how many, who finished."""

    end: float
    passes: int
    finished: list[Request]


class EngineCore:
    """Owns requests, scheduler, KV manager and timing; mutated only by whoever calls step()."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        timing: TimingModel | None = None,
        output_palette: Sequence[int] | None = None,
    ) -> None:
        self.config = config
        self.timing = timing if timing is not None else load_timing_model(config.timing_profile)
        self.host: HostTier | None = None
        if config.has_host_tier:
            self.host = HostTier(
                config.num_host_blocks,
                config.block_size,
                record_events=config.enable_kv_cache_events,
            )
        evict = self.host is not None and config.offload_policy is OffloadPolicy.EVICT
        self.pool = BlockPool(
            config.num_gpu_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            eviction_policy=config.eviction_policy,
            record_events=config.enable_kv_cache_events,
            keep_tokens=self.host is not None,
            host_holds=self.host.holds if evict and self.host is not None else None,
        )
        self.offload: OffloadManager | None = None
        if self.host is not None:
            self.offload = OffloadManager(config, self.pool, self.host, self.timing.prefill_ms)
        self._write_through = self.offload is not None and not evict
        # Offload on eviction copies in the background, as KVBM does, to keep about one
        # pass's worth of blocks reusable (or on their way): admissions then rarely wait
        # for a copy. Capped at 1/8 of the pool, so the device cache stays mostly intact.
        self._evict_ahead = 0
        if evict:
            pass_blocks = -(-config.max_num_batched_tokens // config.block_size)
            self._evict_ahead = min(pass_blocks, config.num_gpu_blocks // 8)
        self.kv = KVCacheManager(self.pool, self.offload)
        self.scheduler = Scheduler(config, self.kv)
        self.time = 0.0  # the latest time the core was driven to
        self.hasher = BlockHasher(config.seed)
        self.sampler = OutputTokenSampler(
            output_palette if output_palette is not None else range(config.vocab_size),
            config.eos_token_id,
            config.eos_probability,
            config.seed,
        )
        self.requests: dict[str, Request] = {}
        self._total_kv_tokens = config.num_gpu_blocks * config.block_size

    # -- intake -------------------------------------------------------------------------------

    def check_request(self, spec: EngineRequest) -> int:
        """Validate without changing anything; returns the resolved max_tokens.

        Pure, so a driver can reject a request in the caller's context before
        handing it to the engine loop.
        """
        cfg = self.config
        prompt = spec.prompt_token_ids
        n = len(prompt)
        if n == 0:
            raise RequestRejected("the prompt is empty: at least one token is needed")
        try:
            array("I", prompt)  # C-speed check: integers in [0, 2^32), as block hashing needs
        except (TypeError, OverflowError) as exc:
            raise RequestRejected(
                f"prompt token ids must be integers in [0, 2^32): {exc}"
            ) from None
        if n >= cfg.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"your prompt contains {n} input tokens, leaving no room for output."
            )
        sp = spec.sampling
        room = cfg.max_model_len - n
        max_tokens = room if sp.max_tokens is None else sp.max_tokens
        if max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens}")
        if max_tokens > room:
            raise RequestRejected(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} in "
                "the completion)."
            )
        if sp.min_tokens < 0 or sp.min_tokens > max_tokens:
            raise RequestRejected(
                f"min_tokens must be in [0, max_tokens={max_tokens}], got {sp.min_tokens}"
            )
        # A request the pool can never hold would wait forever: refuse it now. Its peak is
        # n + max_tokens - 1 KV tokens: the last sampled token is never computed.
        blocks = -(-(n + max_tokens - 1) // cfg.block_size)
        if blocks > cfg.num_gpu_blocks:
            raise RequestRejected(
                f"the request needs up to {blocks} KV blocks ({n} prompt + {max_tokens} output "
                f"tokens at block_size {cfg.block_size}) but the KV cache has only "
                f"{cfg.num_gpu_blocks} blocks (num_gpu_blocks); lower max_tokens"
            )
        if spec.request_id in self.requests:
            raise RequestRejected(f"request id {spec.request_id!r} is already in use")
        try:  # hashed into block keys inside the loop: a bad string must fail here, not there
            extra_keys_bytes(spec.lora_name, spec.cache_salt)
            spec.request_id.encode()
        except (UnicodeEncodeError, TypeError, AttributeError) as exc:
            raise RequestRejected(f"invalid request id, lora_name or cache_salt: {exc}") from None
        return max_tokens

    def add_request(self, spec: EngineRequest) -> Request:
        max_tokens = self.check_request(spec)
        request = Request(
            request_id=RequestId(spec.request_id),
            all_token_ids=list(spec.prompt_token_ids),
            num_prompt_tokens=len(spec.prompt_token_ids),
            max_tokens=max_tokens,
            sampling=spec.sampling,
            arrival_time=spec.arrival_time,
            priority=spec.priority,
            lora_name=spec.lora_name,
            token_seed=self.sampler.request_seed(spec.request_id),
        )
        if self.config.enable_prefix_caching:
            if spec.block_hashes is not None:
                request.block_hashes = list(spec.block_hashes)
            request.enable_hashing(self.hasher, self.config.block_size, spec.cache_salt)
        self.requests[spec.request_id] = request
        self.scheduler.add(request)
        return request

    def abort_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Abort wherever the request is; its blocks are freed at once. None if unknown."""
        request = self.finish_request(request_id, now, RequestStatus.FINISHED_ABORTED)
        return None if request is None else self._final_output(request, now)

    def stop_request(self, request_id: str, now: float) -> RequestOutput | None:
        """Finish with reason 'stop' (a stop string matched in the detokenized text)."""
        request = self.finish_request(request_id, now, RequestStatus.FINISHED_STOPPED)
        return None if request is None else self._final_output(request, now)

    def finish_request(self, request_id: str, now: float, status: RequestStatus) -> Request | None:
        """End a request outside a pass (abort, stop string); returns it for observers."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and self.offload is not None:
            self.offload.cancel_load(now, request)
        self.scheduler.finish(request, status)
        request.finished_time = now
        return request

    @staticmethod
    def _final_output(request: Request, now: float) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=[],
            time=now,
            finished=True,
            finish_reason=request.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            num_host_cached_tokens=request.num_host_cached_tokens,
        )

    # -- state --------------------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def has_pending_transfers(self) -> bool:
        """Host-tier transfers in flight: the core needs driving until they end."""
        return self.offload is not None and self.offload.has_pending

    def next_transfer_deadline(self, direction: Direction | None = None) -> float | None:
        """When a transfer next ends or a load times out (None: nothing in flight)."""
        return None if self.offload is None else self.offload.next_deadline(direction)

    def stall_error(self) -> RuntimeError:
        """What a driver raises when a pass scheduled nothing although requests remain (a bug:
        every admitted request fits the pool, and running requests preempt others for room)."""
        return RuntimeError(
            f"engine stalled: {len(self.requests)} unfinished requests, none schedulable"
        )

    # -- the pass -----------------------------------------------------------------------------

    def advance_transfers(self, now: float) -> StepResult:
        """Apply the transfers due by `now` without running a pass (an idle result)."""
        self.time = max(self.time, now)
        records = self._poll_transfers(now)
        return StepResult(now, now, [], self._stats(), [], self._take_events(), records)

    def reset_prefix_cache(self, now: float) -> tuple[int, StepResult]:
        """Clear the device prefix cache of blocks nobody references (POST
        /reset_prefix_cache); returns the number cleared and an idle result carrying the
        events: AllBlocksCleared, then BlockStored for what every tier still holds."""
        self.time = max(self.time, now)
        pending = self._take_events()  # recorded before the reset: they go out first
        cleared = self.pool.reset_prefix_cache()
        if self.host is not None:
            self.host.announce()
        events = pending + self._take_events()
        return cleared, StepResult(now, now, [], self._stats(), [], events, [])

    def _poll_transfers(self, now: float) -> list[TransferRecord]:
        offload = self.offload
        if offload is None:
            return []
        loaded, timed_out = offload.poll(now)
        for request in loaded:
            self.kv.finish_load(request)
            self.scheduler.resume(request)
        for request in timed_out:
            self.kv.free(request)  # its load was cancelled: recompute, never load again
            request.skip_host_load = True
            self.scheduler.requeue(request)
        return offload.take_records()

    def _take_events(self) -> list[KVEvent]:
        events = self.pool.take_events()
        if self.host is not None:
            host_events = self.host.take_events()
            if host_events:
                events = events + host_events
        return events

    def _stats(
        self, sched: SchedulerOutput | None = None, outputs: list[RequestOutput] | None = None
    ) -> StepStats:
        s = self.scheduler
        if sched is None:
            return StepStats(len(s.running), s.num_waiting, self.pool.usage, 0, 0, 0, 0, 0, 0)
        return StepStats(
            num_running=len(s.running),
            num_waiting=s.num_waiting,
            kv_usage=self.pool.usage,
            num_scheduled_tokens=sched.num_prefill_tokens + sched.num_decodes,
            prompt_tokens_computed=sched.num_prefill_tokens,
            num_generated_tokens=sum(len(o.new_token_ids) for o in outputs or ()),
            num_preemptions=len(sched.preempted),
            prefix_queries=sched.prefix_queries,
            prefix_hits=sched.prefix_hits,
            external_prefix_queries=sched.external_queries,
            external_prefix_hits=sched.external_hits,
        )

    def step(self, now: float) -> StepResult:
        """Schedule one pass starting at `now`, advance every scheduled request to its end.

        Transfers due by `now` are applied first. The returned result's `end` is when
        the pass's tokens exist; a driver delivers them no earlier than that. A result
        that is `idle` ran no pass (everything waits for transfers, or nothing is left).
        """
        self.time = max(self.time, now)
        records = self._poll_transfers(now)
        sched = self.scheduler.schedule()
        offload = self.offload
        if offload is not None:
            for request, start, num_blocks in sched.loads:
                offload.start_load(now, request, start, num_blocks)
            offload.offload_evicted(now)
        prefill_tokens, num_decodes = sched.num_prefill_tokens, sched.num_decodes
        duration = pass_duration_s(
            self.timing,
            PassShape(
                prefill_tokens=prefill_tokens,
                num_decodes=num_decodes,
                active_kv_tokens=self.pool.num_used * self.config.block_size,
                total_kv_tokens=self._total_kv_tokens,
            ),
            self.config.speedup_ratio,
        )
        end = now + duration
        for request in sched.admitted:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        outputs, finished = self._advance(sched, end)
        if offload is not None:
            if self._write_through:
                offload.start_staged(end)  # copies of this pass's new prompt blocks
            elif self._evict_ahead:
                self._evict_in_background(offload, end)
        stats = self._stats(sched, outputs)
        return StepResult(now, end, outputs, stats, finished, self._take_events(), records)

    def _evict_in_background(self, offload: OffloadManager, end: float) -> None:
        """Start copying the least recently used dirty blocks while reusable ones (counting
        copies in flight) are fewer than the evict-ahead mark."""
        pool = self.pool
        short = self._evict_ahead - pool.num_reusable - pool.num_in_flight
        if short > 0 and pool.num_dirty_free:
            pool.evict_dirty(short)
            offload.offload_evicted(end)

    def _advance(
        self, sched: SchedulerOutput, end: float
    ) -> tuple[list[RequestOutput], list[Request]]:
        """Apply the pass: computed tokens, newly full blocks cached, one token per completion."""
        outputs: list[RequestOutput] = []
        finished: list[Request] = []
        kv = self.kv
        bs = self.config.block_size
        token = self.sampler.token  # once per pass: this loop runs per generated token
        eos = self.sampler.eos_token_id
        stage = self.offload.stage_stores if self._write_through and self.offload else None
        for request, n in sched.num_scheduled.items():
            computed = request.num_computed_tokens + n
            request.num_computed_tokens = computed
            if computed // bs > request.num_cached_blocks:
                before = request.num_cached_blocks
                kv.cache_blocks(request)
                if stage is not None:
                    # Write-through copies full prompt blocks; pinned now, before the
                    # request can finish and free them.
                    stop = min(request.num_cached_blocks, request.num_prompt_tokens // bs)
                    if stop > before:
                        stage(request, request.blocks[before:stop])
            num_tokens = len(request.all_token_ids)
            if computed < num_tokens:
                continue  # a prefill chunk that does not reach the end of the prompt
            k = num_tokens - request.num_prompt_tokens  # index of the token sampled now
            sp = request.sampling
            tok = token(request.token_seed, k, not sp.ignore_eos and k >= sp.min_tokens)
            if k < sp.min_tokens and tok in sp.stop_token_ids:  # masked while min_tokens is unmet
                tok = self.sampler.token_avoiding(request.token_seed, k, sp.stop_token_ids)
            request.append_output_token(tok)
            if request.first_token_time is None:
                request.first_token_time = end
            status = self._stop_status(request, tok, k + 1, eos)
            out = RequestOutput(
                request.request_id,
                [tok],
                end,
                False,
                None,
                request.num_prompt_tokens,
                request.num_cached_tokens,
                request.num_host_cached_tokens,
            )
            if status is not None:
                self._finish(request, status, end)
                out.finished = True
                out.finish_reason = request.finish_reason
                finished.append(request)
            outputs.append(out)
        if finished:
            self.scheduler.remove_finished()
        return outputs, finished

    def _finish(self, request: Request, status: RequestStatus, end: float) -> None:
        request.status = status
        request.finished_time = end
        self.kv.free_finished(request)
        del self.requests[request.request_id]

    def run_decodes(self, now: float, stop_at: float) -> DecodeRun | None:
        """Run consecutive passes from `now` while each is every running request decoding one
        token, for drivers that need no per-pass output (replay). None if the next pass is
        not such a pass; then `step()` runs it.

        The passes are the ones `step()` would run, with the same timings and the same pool
        operations in the same order, minus the outputs, stats and events: blocks are
        handed out pass by pass in running order, then each request takes its tokens at
        once. The run ends after the first pass in which a request finishes, that ends at
        or after `stop_at`, or before a pass that would have to preempt. Only for requests
        that end at max_tokens (no EOS drawn, no stop ids), whose finishing pass is known.
        """
        if self.offload is not None or self.pool.record_events:
            return None
        batch = self.scheduler.decode_batch()
        if batch is None:
            return None
        sampler = self.sampler
        for request in batch:
            sp = request.sampling
            if sp.stop_token_ids or (sampler.can_end_early and not sp.ignore_eos):
                return None
        bs = self.config.block_size
        max_passes = min(r.max_tokens - r.num_output_tokens for r in batch)
        # Passes at which each request needs a new block (its next position starts one).
        allocs: dict[int, list[Request]] = {}
        for request in batch:
            first = len(request.blocks) * bs - request.num_computed_tokens + 1
            for p in range(max(first, 1), max_passes + 1, bs):
                allocs.setdefault(p, []).append(request)
        kv = self.kv
        reusable, used = kv.num_reusable, kv.num_used
        num_decodes, speedup = len(batch), self.config.speedup_ratio
        shape_used, duration = -1, 0.0
        passes, start, end = 0, now, now
        for p in range(1, max_passes + 1):
            need = allocs.get(p)
            if need:
                if len(need) > reusable:
                    break  # schedule() would preempt here
                reusable -= len(need)
                used += len(need)
            if used != shape_used:  # a pass's time depends only on this and the batch
                shape_used = used
                shape = PassShape(0, num_decodes, used * bs, self._total_kv_tokens)
                duration = pass_duration_s(self.timing, shape, speedup)
            start, end, passes = end, end + duration, p
            if end >= stop_at:
                break
        if not passes:
            return None
        marks = [(len(r.all_token_ids), len(r.block_hashes)) for r in batch]
        for request in batch:  # tokens (and block hashes) first: no pool state changes yet
            request.append_output_tokens(
                sampler.tokens(request.token_seed, request.num_output_tokens, passes)
            )
        if self._would_dedup(batch, passes):
            for request, (num_tokens, num_hashes) in zip(batch, marks, strict=True):
                del request.all_token_ids[num_tokens:]
                del request.block_hashes[num_hashes:]
            return None
        self.time = max(self.time, start)
        for p in sorted(allocs):
            if p > passes:
                break
            for request in allocs[p]:
                kv.append_blocks(request, 1)
        finished: list[Request] = []
        for request in batch:
            request.num_computed_tokens += passes
            kv.cache_blocks(request)
            if request.num_output_tokens >= request.max_tokens:
                self._finish(request, RequestStatus.FINISHED_LENGTH_CAPPED, end)
                finished.append(request)
        if finished:
            self.scheduler.remove_finished()
        return DecodeRun(end, passes, finished)

    def _would_dedup(self, batch: list[Request], passes: int) -> bool:
        """Whether a block the run fills has a hash already cached (or filled twice in it).
        `step()` would then swap in the cached block in mid-run, freeing one and changing
        the pool's order and usage; the run leaves those passes to `step()`. (Generated
        tokens make this all but impossible, except with tiny vocabularies or blocks.)"""
        if not self.config.enable_prefix_caching:
            return False
        lookup, bs = self.pool.lookup, self.config.block_size
        seen: set[int] = set()
        for request in batch:
            end = (request.num_computed_tokens + passes) // bs
            for block_hash in request.block_hashes[request.num_cached_blocks : end]:
                if block_hash in seen or lookup(block_hash) is not None:
                    return True
                seen.add(block_hash)
        return False

    @staticmethod
    def _stop_status(request: Request, tok: int, num_out: int, eos: int) -> RequestStatus | None:
        # vLLM's order: the length cap wins, then min_tokens gates EOS and stop ids.
        if num_out >= request.max_tokens:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        sp = request.sampling
        if num_out <= sp.min_tokens:
            return None
        if (tok == eos and not sp.ignore_eos) or tok in sp.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        return None
