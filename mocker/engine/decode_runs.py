"""Replay's fast path: runs of passes whose decoding requests are applied at once, the same as
pass by pass."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mocker.engine.core import EngineCore
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.manager import KVCacheManager
from mocker.request import Request, RequestStatus
from mocker.scheduler.scheduler import SchedulerOutput, decodes_next

__all__ = ["DecodeRun", "run_decodes"]

# Passes whose tokens are drawn at once (a window); at its end every decoder takes its share.
# The first window is short: a run's passes are guessed from the decode pass's time, and
# its prefill passes (admissions) are longer; later ones go by the run's own passes.
FIRST_WINDOW = 8
MAX_WINDOW = 64


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """Passes run by `run_decodes`: when the last ended, how many, who finished."""

    end: float
    passes: int
    finished: list[FinishedRequestStats]


def run_decodes(
    core: EngineCore, now: float, stop_at: float, *, through_finishes: bool = False
) -> DecodeRun | None:
    """Run consecutive passes from `now`, as `step()` would run them, for drivers that need
    no per-pass output (replay). None if the next pass has no request that only decodes;
    then `core.step()` runs it.

    The requests that only decode, from the first running one on (the decoders: each past
    its prompt, ending at max_tokens, no EOS drawn, no stop ids), are applied at once: the
    pool operations of every pass happen in it, in `step()`'s order (their new blocks in
    running order, then the rest of the running requests and the admissions, scheduled
    and advanced by the engine's own code, then the decoders' newly full blocks
    registered and their finishes freed, each in running order), but a decoder's tokens,
    computed count and time are applied when a registration or its finish needs them, or
    at the end of a window of passes whose tokens are drawn as one array.

    The run ends after the pass that ends at or after `stop_at`, before a pass that would
    have to preempt, before one that needs the scheduler while tiers, LoRA slots or P/D
    legs are in play, and (unless `through_finishes`) after the first pass in which a
    request finishes.
    """
    if not _batchable(core):
        return None
    run = _Run(core, through_finishes)
    if not run.join(core.scheduler.running):
        return None
    return run.go(now, stop_at)


def _batchable(core: EngineCore) -> bool:
    """Whether any of the engine's passes may be run this way."""
    # Events, LoRA slots, a hybrid model's groups (windows slide, Mamba states move on)
    # and tiers with work in hand change state pass by pass: stepped, not summed. Tiers
    # with nothing in flight under write-through of prompt blocks do nothing in decode
    # passes (a finishing request's free waits for no copy).
    connector = core.connector
    return not (
        (connector is not None and not connector.quiet_for_decodes)
        or core.pool.record_events
        or core.lora is not None
        or core.config.is_hybrid
        or core.scheduler.resumes_pending
    )


class _Run:
    """The decoders' deferred state over the run's passes (pass indexes count from 0).

    Decoder i has applied the passes before `since[i]`; its tokens for the passes from
    `base` on are `rows[i]`, of which it has taken `taken[i]`. Its next new block is due
    at pass `need_at[i]`, its next newly full block at `fill_at[i]`, its finish at
    `finish_at[i]`; `events` lists, per pass, the decoders that have one then."""

    __slots__ = ("alive", "base", "bs", "core", "dead", "events", "fill_at", "finish_at",
                 "finished", "kv", "mixed_ok", "need_at", "needs", "reqs", "rows", "scheduler",
                 "since", "taken", "through")  # fmt: skip

    def __init__(self, core: EngineCore, through_finishes: bool) -> None:
        self.core = core
        kv = core.kv
        assert isinstance(kv, KVCacheManager)  # (a hybrid model's passes are stepped)
        self.kv = kv
        self.scheduler = core.scheduler
        self.bs = core.config.block_size
        # Tiers (even quiet ones) may hold a finished request's blocks for a copy, and
        # would answer an admission's lookup: a finish ends the run, admissions are stepped.
        # The closed loop and P/D hand work on at a finish (the driver says).
        self.through = through_finishes and core.connector is None
        self.mixed_ok = core.connector is None and core.pulls is None and core.holds is None
        self.reqs: list[Request] = []
        self.dead: list[bool] = []
        self.since: list[int] = []
        self.taken: list[int] = []
        self.rows: list[list[int]] = []
        self.need_at: list[int] = []
        self.fill_at: list[int] = []
        self.finish_at: list[int] = []
        self.needs: dict[int, list[int]] = {}  # pass -> decoders due a new block
        self.events: dict[int, list[int]] = {}  # pass -> decoders due a fill or a finish
        self.finished: list[FinishedRequestStats] = []
        self.base = 0
        self.alive = 0  # decoders not finished: the first `alive` running requests

    # -- membership ---------------------------------------------------------------------------

    def join(self, running: list[Request], at: int = 0) -> bool:
        """Take the running requests that decode next, from the first not yet taken, as
        decoders from pass `at` on. False if none joined."""
        early = self.core.sampler.can_end_early
        budget = self.core.config.max_num_batched_tokens
        start = i = self.alive
        while i < len(running) and i < budget:
            request = running[i]
            sp = request.sampling
            if not decodes_next(request) or sp.stop_token_ids or (early and not sp.ignore_eos):
                break
            self._add(request, at)
            i += 1
        self.alive = i
        return i > start

    def _add(self, request: Request, at: int) -> None:
        index = len(self.reqs)
        self.reqs.append(request)
        self.dead.append(False)
        self.since.append(at)
        self.taken.append(0)
        self.rows.append([])
        computed = request.num_computed_tokens
        bs = self.bs
        self.need_at.append(-1)
        self._due(self.needs, self.need_at, index, at + len(request.blocks) * bs - computed)
        self.fill_at.append(-1)
        fill = at + (request.num_cached_blocks + 1) * bs - 1 - computed
        self._due(self.events, self.fill_at, index, max(fill, at))
        outputs = len(request.all_token_ids) - request.num_prompt_tokens
        self.finish_at.append(-1)
        self._due(self.events, self.finish_at, index, at + request.max_tokens - outputs - 1)

    @staticmethod
    def _due(table: dict[int, list[int]], at: list[int], index: int, when: int) -> None:
        """Decoder `index` has its next such event at pass `when`."""
        at[index] = when
        slot = table.get(when)
        if slot is None:
            table[when] = [index]
        elif index not in slot:  # (a fill and a finish in one pass: listed once)
            slot.append(index)

    # -- the passes -----------------------------------------------------------------------------

    def go(self, now: float, stop_at: float) -> DecodeRun | None:
        core, kv, scheduler, bs = self.core, self.kv, self.scheduler, self.bs
        j = 0
        start = end = now
        shape: tuple[int, int] | None = None
        duration = 0.0
        began = now
        width = self._window(stop_at - now, -1.0)
        while True:
            if j == self.base + width:  # the window's tokens are used up: take them
                self._settle(j, end)
                self.join(scheduler.running, j)
                width = self._window(stop_at - now, (now - began) / j)
            num_decoders = self.alive
            running = scheduler.running
            mixed = len(running) > num_decoders or bool(scheduler.waiting)
            if mixed and (not self.mixed_ok or scheduler.resumes_pending):
                break
            need = self.needs.pop(j, None)
            num_need = 0 if need is None else len(need)
            room = num_need + (self._tail_need(running, num_decoders) if mixed else 0)
            if room > kv.num_reusable:
                if need is not None:
                    self.needs[j] = need
                break  # step() would preempt in this pass
            if need is not None:
                need = sorted(i for i in need if not self.dead[i])
                kv.append_block_each([self.reqs[i] for i in need])
                for i in need:
                    self._due(self.needs, self.need_at, i, j + bs)
            if mixed:
                sched: SchedulerOutput | None = scheduler.schedule_after_decodes(num_decoders)
                assert sched is not None and not sched.preempted  # (the room was there)
                duration = core.pass_duration(
                    sched.num_prefill_tokens, sched.num_decodes, kv.num_used
                )
                shape = None
            else:
                sched = None
                if shape != (num_decoders, kv.num_used):
                    shape = (num_decoders, kv.num_used)
                    duration = core.pass_duration(0, num_decoders, kv.num_used)
            start, end = now, now + duration
            ended = self._end_pass(j, end)
            if sched is not None:
                finished = core.end_pass(sched, start, end)
                if finished:
                    self.finished += finished
                    ended = True
            else:
                core.time = max(core.time, start)
            if ended:
                scheduler.remove_finished()
            j += 1
            now = end
            if end >= stop_at or (ended and not self.through) or not self.alive:
                break
        if j == 0:
            return None
        self._settle(j, end)
        return DecodeRun(end, j, self.finished)

    def _window(self, left: float, per_pass: float) -> int:
        """Passes whose tokens the next draw covers: about those in the `left` seconds before
        the run's stop at `per_pass` seconds each (< 0: the first window, at most
        FIRST_WINDOW, at the decode pass's time), at most MAX_WINDOW; their rows drawn."""
        alive = [i for i, d in enumerate(self.dead) if not d]
        width = MAX_WINDOW
        if per_pass < 0:
            width = FIRST_WINDOW
            per_pass = self.core.pass_duration(0, len(alive), self.kv.num_used)
        if per_pass > 0 and left != math.inf:
            width = max(1, min(width, math.ceil(left / per_pass) + 1))
        reqs = self.reqs
        seeds = [reqs[i].token_seed for i in alive]
        starts = [len(reqs[i].all_token_ids) - reqs[i].num_prompt_tokens for i in alive]
        rows = self.core.sampler.token_rows(seeds, starts, width) if alive else []
        for i, row in zip(alive, rows, strict=True):
            self.rows[i] = row
            self.taken[i] = 0
        self.base = self.since[alive[0]] if alive else 0
        return width

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
        bs, kv = self.bs, self.kv
        ended = False
        for i in due:
            if self.dead[i]:
                continue  # (a fill due after its finish)
            request = self.reqs[i]
            finishing = self.finish_at[i] == j
            filling = self.fill_at[i] == j
            if finishing:
                self._catch_up(i, j + 1, end)  # (its computed count is now this pass's)
                if request.num_computed_tokens // bs > request.num_cached_blocks:
                    kv.cache_blocks(request)
                self.finished.append(
                    self.core.finish_in_pass(request, RequestStatus.FINISHED_LENGTH_CAPPED, end)
                )
                self.dead[i] = True
                self.alive -= 1
                ended = True
            elif filling:
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

    def _settle(self, j: int, end: float) -> None:
        """Every live decoder applies the passes before j (the last of them ended at `end`)."""
        for i, dead in enumerate(self.dead):
            if not dead:
                self._catch_up(i, j, end)
