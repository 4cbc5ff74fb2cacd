"""The engine core's pass: its duration, the scheduled requests' tokens, finishing in it."""

from __future__ import annotations

from mocker.disagg.pulls import PULL_SOURCE
from mocker.engine.core_results import CoreResults
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stats import FinishedRequestStats
from mocker.engine.stopping import draw, stop_status, unmasked
from mocker.request import Request, RequestStatus
from mocker.scheduler.output import SchedulerOutput
from mocker.timing import PassShape, pass_duration_s

__all__ = ["COLUMN_MIN_REQUESTS", "CorePass"]

_new_output = object.__new__  # (see `_advance`)

# A replay's pass draws its tokens as one array from this many sampling requests on: the
# array has a fixed cost that a token drawn alone does not, and breaks even about here.
# Below it a pass draws one at a time.
COLUMN_MIN_REQUESTS = 24


class CorePass(CoreResults):
    """EngineCore's pass: `step(now)` schedules one and applies it; time is only an argument."""

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
        sync = connector.sync_loads if connector is not None else None
        if sync is not None and sync.pending:  # the pass reads its loads before it computes
            end += sync.start(now)
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
            if sync is not None and sync.pending:
                sync.finish()
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

        if self._applier is not None:
            partial = self._applier.run(scheduled, end, emit, column, registered,
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


def _first_scheduled(admitted: list[Request], now: float) -> None:
    """Requests admitted in a pass starting at `now`: scheduled first then, unless before."""
    for request in admitted:
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
