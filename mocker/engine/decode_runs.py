"""Replay's fast path: runs of passes whose decoding requests are applied at once, the same as
pass by pass."""

from __future__ import annotations

import heapq
import math

from mocker.engine.core import EngineCore
from mocker.engine.decode_batch import DecodeRun, batch_run, batchable, ends_at_max_tokens
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.manager import KVCacheManager
from mocker.request import Request, RequestStatus, TokenIds
from mocker.scheduler.output import SchedulerOutput
from mocker.scheduler.running import decodes_next

__all__ = ["DecodeRuns", "run_decodes"]

# Passes whose tokens are drawn at once (a window); at its end every decoder takes its share.
WINDOW = 64
# Fewer running requests than this: their passes are not deferred (see `DecodeRuns.run`).
# Deferring a dozen decoders costs more bookkeeping than stepping them (the 8-engine Mooncake
# replay of bench/replay_speed.py runs about 12 on each).
MIN_DEFERRED = 32


def run_decodes(
    core: EngineCore,
    now: float,
    stop_at: float,
    *,
    through_finishes: bool = False,
    min_deferred: int | None = None,
) -> DecodeRun | None:
    """One `DecodeRuns.run`, every request's state applied after it."""
    runs = DecodeRuns(core, through_finishes=through_finishes, min_deferred=min_deferred)
    run = runs.run(now, stop_at)
    runs.settle()
    return run


class DecodeRuns:
    """Runs consecutive passes of one engine, as `step()` would run them, for drivers that
    need no per-pass output (replay); `run` returns None when the next pass has no request
    that only decodes, and then `core.step()` runs it.

    The requests that only decode, from the first running one on (the decoders: each past
    its prompt, ending at max_tokens, no EOS drawn, no stop ids), are applied at once: the
    pool operations of every pass happen in it, in `step()`'s order (their new blocks in
    running order, then the rest of the running requests and the admissions, scheduled
    and advanced by the engine's own code, then the decoders' newly full blocks
    registered and their finishes freed, each in running order), but a decoder's tokens,
    computed count and time are applied only when a registration or its finish needs
    them, at the end of a window of WINDOW passes (whose tokens are drawn as one array),
    or by `settle`. So they carry over from one `run` to the next: between the two, the
    driver may add requests and read the pool and the queues, nothing else (`settle`
    first, as `run` does itself before it returns None).

    A run ends after the pass that ends at or after `stop_at`, before a pass that would
    have to preempt, before one that needs the scheduler while tiers, LoRA slots or P/D
    legs are in play, and (unless `through_finishes`) after the first pass in which a
    request finishes.

    With nothing carried over and fewer than `min_deferred` running requests, a run is
    the older kind (`batch_run`): passes in which every running request decodes, each
    request's tokens appended at its end; others are left to `step()`.

    Decoder i has applied the passes before `since[i]` (passes count from the first run);
    its tokens from then on are `rows[i]`, of which it has taken `taken[i]`. Its next new
    block is due at pass `need_at[i]`, its next newly full block at `fill_at[i]`, its
    finish at `finish_at[i]`; `needs` and `events` list, per pass, the decoders due then.
    """

    __slots__ = ("alive", "bs", "context", "core", "ctx_off", "dead", "end", "events",
                 "fill_at", "finish_at", "finished", "j", "kept", "last_start", "marks",
                 "min_deferred", "mixed_ok", "need_at", "needs", "reqs", "rows", "scheduler",
                 "since", "taken", "through", "window_end")  # fmt: skip

    def __init__(
        self, core: EngineCore, *, through_finishes: bool = False, min_deferred: int | None = None
    ) -> None:
        self.core = core
        self.min_deferred = MIN_DEFERRED if min_deferred is None else min_deferred
        self.scheduler = core.scheduler
        self.bs = core.config.block_size
        # Tiers (even quiet ones) may hold a finished request's blocks for a copy, and
        # would answer an admission's lookup: a finish ends the run, admissions are stepped.
        # The closed loop and P/D hand work on at a finish (the driver says).
        self.through = through_finishes and core.connector is None
        self.mixed_ok = core.connector is None and core.pulls is None and core.holds is None
        self.j = 0  # passes run
        self.end = self.last_start = -math.inf  # the last pass's end and start
        self.window_end = 0  # the pass at which the decoders' rows run out
        self.finished: list[FinishedRequestStats] = []
        # The timing model reads the decoders' context: each pass is timed on its own.
        self.context = core.timing.reads_context
        self._reset()

    def _reset(self) -> None:
        """No decoders (their state all applied)."""
        self.reqs: list[Request] = []
        self.dead: list[bool] = []
        self.since: list[int] = []
        self.taken: list[int] = []
        self.rows: list[TokenIds] = []
        self.need_at: list[int] = []
        self.fill_at: list[int] = []
        self.finish_at: list[int] = []
        self.needs: dict[int, list[int]] = {}  # pass -> decoders due a new block
        self.events: dict[int, list[int]] = {}  # pass -> decoders due a fill or a finish
        self.marks: list[int] = []  # a heap of the passes `needs` or `events` list
        self.alive = 0  # decoders not finished: the first `alive` running requests
        # Σ over live decoders of (computed tokens − the pass they were applied to): at pass
        # j they have computed ctx_off + alive × j tokens, and read one more each.
        self.ctx_off = 0
        # The last decode pass timed: (alive, ctx_off, from pass, until pass, duration).
        self.kept: tuple[int, int, int, int, float] = (-1, 0, 0, 0, 0.0)

    # -- the driver's calls ---------------------------------------------------------------------

    def run(self, now: float, stop_at: float) -> DecodeRun | None:
        """Passes from `now` (see the class). None if none could run: every decoder's state
        is then applied, and `core.step()` runs the next pass."""
        core = self.core
        if self.reqs and core.time != self.last_start:
            raise RuntimeError("the engine was stepped while a decode run held its requests")
        if not self.alive:
            if self.reqs:
                self.settle()  # (the window's decoders have all finished: start afresh)
            if len(self.scheduler.running) < self.min_deferred:
                # Few running requests: deferring them saves less than its bookkeeping
                # costs. Runs while every one of them decodes, else step().
                return batch_run(core, now, stop_at)
        if not batchable(core):
            self.settle()
            return None
        kv = core.kv
        assert isinstance(kv, KVCacheManager)  # (a hybrid model's passes are stepped)
        if self.j == self.window_end:
            self._new_window()
        else:
            self._join(self.j)  # (the requests whose prompts ended since the last run)
        passes = self._run_passes(kv, now, stop_at)
        if not passes or core.connector is not None:
            # (A tier's transfers may move the engine's clock between two runs.)
            self.settle()
        if not passes:
            return None
        finished, self.finished = self.finished, []
        return DecodeRun(self.end, passes, finished)

    def settle(self) -> None:
        """Every decoder applies its passes: the requests are as `step()` would leave them."""
        j, end = self.j, self.end
        for i, dead in enumerate(self.dead):
            if not dead:
                self._catch_up(i, j, end)
        self._reset()
        self.window_end = j

    # -- membership -------------------------------------------------------------------------------

    def _new_window(self) -> None:
        """Every decoder takes its tokens so far; the running requests that decode next join
        (again) with rows for the next WINDOW passes."""
        self.settle()
        self._join(self.j)

    def _join(self, at: int) -> None:
        """The running requests that decode next, from the first not yet a decoder, join
        from pass `at` on, with their rows up to the window's end."""
        core = self.core
        early = core.sampler.can_end_early
        budget = core.config.scheduler.max_num_batched_tokens
        running = self.scheduler.running
        start = i = self.alive
        while i < len(running) and i < budget:
            request = running[i]
            if not (decodes_next(request) and ends_at_max_tokens(request, early)):
                break
            self._add(request, at)
            i += 1
        if i == start:
            return
        self.alive = i
        if not start:
            self.window_end = at + WINDOW
        joined = self.reqs[len(self.reqs) - (i - start) :]
        rows = core.sampler.token_rows(
            [r.token_seed for r in joined],
            [len(r.all_token_ids) - r.num_prompt_tokens for r in joined],
            self.window_end - at,
        )
        self.rows[len(self.reqs) - len(joined) :] = rows

    def _add(self, request: Request, at: int) -> None:
        index = len(self.reqs)
        self.reqs.append(request)
        self.dead.append(False)
        self.since.append(at)
        self.taken.append(0)
        self.rows.append([])
        computed = request.num_computed_tokens
        self.ctx_off += computed - at
        bs = self.bs
        self.need_at.append(-1)
        self._due(self.needs, self.need_at, index, at + len(request.blocks) * bs - computed)
        self.fill_at.append(-1)
        fill = at + (request.num_cached_blocks + 1) * bs - 1 - computed
        self._due(self.events, self.fill_at, index, max(fill, at))
        outputs = len(request.all_token_ids) - request.num_prompt_tokens
        self.finish_at.append(-1)
        self._due(self.events, self.finish_at, index, at + request.max_tokens - outputs - 1)

    def _due(self, table: dict[int, list[int]], at: list[int], index: int, when: int) -> None:
        """Decoder `index` has its next such event at pass `when`."""
        at[index] = when
        slot = table.get(when)
        if slot is None:
            table[when] = [index]
            heapq.heappush(self.marks, when)
        elif index not in slot:  # (a fill and a finish in one pass: listed once)
            slot.append(index)

    # -- the passes -------------------------------------------------------------------------------

    def _run_passes(self, kv: KVCacheManager, now: float, stop_at: float) -> int:
        """Run passes from `now`; how many ran."""
        core, scheduler, pool, bs = self.core, self.scheduler, self.core.pool, self.bs
        context = self.context
        first = j = self.j
        shape_decoders = shape_used = -1
        duration = 0.0
        while self.alive:
            if j == self.window_end:  # the window's tokens are used up: take them
                self.j = j
                self._new_window()
                if not self.alive:
                    break
            num_decoders = self.alive
            running = scheduler.running
            mixed = len(running) > num_decoders or bool(scheduler.waiting)
            if mixed and (not self.mixed_ok or scheduler.resumes_pending):
                break
            if not mixed:
                if context:
                    duration = self._decode_duration(j)
                elif num_decoders != shape_decoders or pool.num_used != shape_used:
                    shape_decoders, shape_used = num_decoders, pool.num_used
                    duration = self._decode_duration(j)
                upto = self._next_event(j)
                if upto > j:
                    # Passes in which nothing but time moves: summed one by one, as step()
                    # would (the same floating-point sums).
                    start = now
                    while j < upto:
                        start, now = now, now + duration
                        j += 1
                        if now >= stop_at:
                            break
                        if context:
                            duration = self._decode_duration(j)
                    core.time = max(core.time, start)
                    self.last_start, self.end = start, now
                    if now >= stop_at:
                        break
                    continue
            need = self.needs.get(j)
            room = 0 if need is None else len(need)
            if mixed:
                room += self._tail_need(running, num_decoders)
            if room > pool.num_reusable:
                break  # step() would preempt in this pass
            if need is not None:
                del self.needs[j]
                need = sorted(i for i in need if not self.dead[i])
                kv.append_block_each([self.reqs[i] for i in need])
                for i in need:
                    self._due(self.needs, self.need_at, i, j + bs)
            if mixed:
                sched: SchedulerOutput | None = scheduler.schedule_after_decodes(num_decoders)
                assert sched is not None and not sched.preempted  # (the room was there)
                if context:
                    sched.decode_context += self.ctx_off + num_decoders * (j + 1)
                duration = core.scheduled_duration(sched)
                shape_decoders = -1
            else:
                sched = None
                if context or pool.num_used != shape_used:
                    shape_used = pool.num_used
                    duration = self._decode_duration(j)
            end = now + duration
            ended = self._end_pass(j, end)
            if sched is not None:
                finished = core.end_pass(sched, now, end)
                if finished:
                    self.finished += finished
                    ended = True
            else:
                core.time = max(core.time, now)
            if ended:
                scheduler.remove_finished()
            self.last_start, self.end = now, end
            j += 1
            now = end
            if end >= stop_at or (ended and not self.through):
                break
        self.j = j
        return j - first

    def _decode_duration(self, j: int) -> float:
        """Pass j's duration when it is only the decoders decoding (a context-reading model's
        kept while its answer holds: the same decoders, fewer passes on than its span)."""
        alive = self.alive
        core = self.core
        if not self.context:
            return core.pass_duration(0, alive, core.pool.num_used, prefill_requests=0,
                                      prefill_context=0, decode_context=0)  # fmt: skip
        kept = self.kept
        if kept[0] == alive and kept[1] == self.ctx_off and kept[2] <= j < kept[3]:
            return kept[4]
        duration, span = core.decode_pass(alive, core.pool.num_used,
                                          self.ctx_off + alive * (j + 1))  # fmt: skip
        self.kept = (alive, self.ctx_off, j, j + span, duration)
        return duration

    def _next_event(self, j: int) -> int:
        """The first pass from j on at which a decoder has something due (a new block, a full
        one, its finish), or the window ends."""
        marks, needs, events = self.marks, self.needs, self.events
        while marks and (marks[0] < j or (marks[0] not in needs and marks[0] not in events)):
            heapq.heappop(marks)
        return min(marks[0], self.window_end) if marks else self.window_end

    def _tail_need(self, running: list[Request], num_decoders: int) -> int:
        """At most how many blocks the other running requests take in the next pass (their
        whole prompts' worth): with that room, `schedule()` preempts nobody."""
        bs = self.bs
        need = 0
        for request in running[num_decoders:]:
            more = -(-len(request.all_token_ids) // bs) - len(request.blocks)
            if more > 0:
                need += more
        return need

    def _end_pass(self, j: int, end: float) -> bool:
        """The decoders' share of pass j's end, in running order: newly full blocks
        registered, finishes. True if one finished."""
        due = self.events.pop(j, None)
        if due is None:
            return False
        due.sort()
        bs, kv = self.bs, self.core.kv
        ended = False
        for i in due:
            if self.dead[i]:
                continue  # (a fill due after its finish)
            request = self.reqs[i]
            if self.finish_at[i] == j:
                self._catch_up(i, j + 1, end)  # (its computed count is now this pass's)
                self.ctx_off -= request.num_computed_tokens - self.since[i]
                if request.num_computed_tokens // bs > request.num_cached_blocks:
                    kv.cache_blocks(request)
                self.finished.append(
                    self.core.finish_in_pass(request, RequestStatus.FINISHED_LENGTH_CAPPED, end)
                )
                self.dead[i] = True
                self.alive -= 1
                ended = True
            elif self.fill_at[i] == j:
                self._catch_up(i, j, None)  # (the block's last token was sampled before j)
                computed = request.num_computed_tokens + 1
                kv.cache_blocks(request, computed)
                self._due(self.events, self.fill_at, i,
                          j + (request.num_cached_blocks + 1) * bs - computed)  # fmt: skip
        return ended

    def _catch_up(self, i: int, upto: int, end: float | None) -> None:
        """Decoder i applies its passes before `upto`: tokens, computed count, and the time
        its last token came (`end`, the end of pass upto - 1; None: left for later)."""
        since = self.since[i]
        if upto <= since:
            return
        request = self.reqs[i]
        taken = self.taken[i]
        count = upto - since
        row = self.rows[i]
        if taken or count < len(row):
            row = row[taken : taken + count]
        request.append_output_tokens(row)
        self.taken[i] = taken + count
        request.num_computed_tokens += count
        if end is not None:
            request.last_token_time = end
        self.since[i] = upto


# -- few decoders: runs of passes in which every running request decodes ------------------
