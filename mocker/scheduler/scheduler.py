"""vLLM v1 scheduling pass: running first, then waiting, one budget, preemption by recompute."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mocker.request import Request, RequestStatus
from mocker.scheduler.admission import schedule_ready, schedule_waiting
from mocker.scheduler.deferral import unblock
from mocker.scheduler.output import SchedulerOutput
from mocker.scheduler.preemption import preempt
from mocker.scheduler.prefix_accounting import count_prefix
from mocker.scheduler.running import schedule_running
from mocker.scheduler.state import SchedulerState

if TYPE_CHECKING:
    pass

__all__ = ["Scheduler"]


class Scheduler(SchedulerState):
    """Decides each pass; allocates through the KV manager, never touches the pool directly,
    and asks the connector (if tiers are below the device) what they hold."""

    __slots__ = ()

    # -- queue changes ------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.push(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request wherever it is and free its blocks at once (a load it waits for
        must have been cancelled first)."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self.loading.discard(request)
        elif not self.waiting.remove(request) and request in self.ready:
            self.ready.remove(request)
        request.status = status
        self.free_finished(request)

    def free_finished(self, request: Request) -> None:
        """Release a finished request's blocks: now, or (write-through) when the connector's
        copies of them have ended (vLLM's request_finished → delay_free)."""
        connector = self.connector
        if connector is not None and connector.request_finished(request):
            request.num_cached_blocks = 0
            return
        self.kv.free(request)

    def resume(self, request: Request) -> None:
        """Its KV loaded: it computes the rest of its prompt before fresh admissions. Its
        hits count now (whatever happens to the loaded blocks before it resumes)."""
        self.loading.discard(request)
        request.status = RequestStatus.WAITING
        self.ready.append(request)
        device, tiers = request.load_hits
        count_prefix(self, request, device, tiers, self._carry)

    def requeue(self, request: Request) -> None:
        """Its load was dropped (timeout) and its blocks freed: it waits again, in front."""
        self.loading.discard(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        self.waiting.push_front(request)

    @property
    def num_waiting(self) -> int:
        """As vLLM counts: requests waiting for KV to load are waiting too."""
        return len(self.waiting) + len(self.loading) + len(self.ready)

    def remove_finished(self) -> None:
        """Drop finished requests from the running list (once per pass, O(running))."""
        last_unfinished = RequestStatus.PREEMPTED  # RequestStatus.is_finished, inlined
        self.running = [r for r in self.running if r.status <= last_unfinished]

    # -- the pass -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out, carry = SchedulerOutput(), self._carry
        if carry.prefix_queries:
            out.prefix_queries, out.prefix_hits = carry.prefix_queries, carry.prefix_hits
            out.external_queries, out.external_hits = carry.external_queries, carry.external_hits
            # (Zeroed in place: only these counts of the carry are ever set.)
            carry.prefix_queries = carry.prefix_hits = 0
            carry.external_queries = carry.external_hits = 0
            out.external_by_tier, carry.external_by_tier = carry.external_by_tier, None
        budget, stalled = schedule_running(self, self._token_budget, out)
        # As vLLM: a pass that had to preempt admits nobody new (unless nothing is left to
        # run). Nor does one in which a running request waits for blocks being offloaded:
        # they are its when they land.
        if not stalled and (not out.preempted or not out.num_scheduled):
            budget = schedule_ready(self, budget, out)
            schedule_waiting(self, budget, out)
        while not out.num_scheduled and not self.running and not out.loads and unblock(self):
            budget = schedule_ready(self, budget, out)
            schedule_waiting(self, budget, out)
        return out

    def decode_batch(self) -> list[Request] | None:
        """The running requests, if the next pass can only be each of them decoding one
        token: nothing waits to be admitted or resumed, and every one is past its prompt.
        None otherwise. (Whether the pool has room for their next blocks is the caller's
        to check: without it, `schedule()` preempts.)"""
        running = self.running
        if (
            not running
            or self.waiting
            or self.ready
            or self.loading
            or self._carry.prefix_queries
            or len(running) > self._token_budget
        ):
            return None
        # Newest first: a request still in its prompt is most often the last admitted.
        for request in reversed(running):
            num_tokens = len(request.all_token_ids)
            if (
                request.num_computed_tokens != num_tokens - 1
                or num_tokens <= request.num_prompt_tokens
            ):
                return None
        return running

    def schedule_after_decodes(self, num_decodes: int) -> SchedulerOutput:
        """`schedule()` for a pass whose first `num_decodes` running requests each decode one
        token (see `decodes_next`) and already hold the blocks for it, their caller having
        allocated them in running order as `schedule_running` would have: the rest of the
        running requests and the admissions, with the budget left. The decoders are counted,
        not listed in `num_scheduled`. (Nothing may be waiting to resume: see
        `resumes_pending`.)"""
        out = SchedulerOutput(num_decodes=num_decodes)
        budget, stalled = schedule_running(self, self._token_budget - num_decodes, out, num_decodes)
        if not stalled and (not out.preempted or not out.num_scheduled):
            budget = schedule_ready(self, budget, out)
            schedule_waiting(self, budget, out)
        return out

    @property
    def resumes_pending(self) -> bool:
        """Requests wait for their KV to load or to resume, or a pass is still to report the
        prefix counts of loads that ended: `schedule()` has more to do than run and admit."""
        return bool(self.ready or self.loading or self._carry.prefix_queries)

    def preempt_running(self) -> SchedulerOutput:
        """vLLM's reset_running_requests: every running request preempted (recomputed when
        it runs again), the last first, so that they wait in their order."""
        out = SchedulerOutput()
        while self.running:
            preempt(self, self.running[-1], out)
        return out
