"""vLLM v1 scheduling pass: running first, then waiting, one budget, preemption by recompute."""

from __future__ import annotations

from dataclasses import dataclass, field

from mocker.config import EngineConfig, PreemptionVictim
from mocker.kv.manager import KVCacheManager
from mocker.request import Request, RequestStatus
from mocker.scheduler.waiting_queue import WaitingQueue

__all__ = ["Scheduler", "SchedulerOutput"]


@dataclass(slots=True)
class SchedulerOutput:
    """One pass: tokens to compute per request, and what changed to make room."""

    num_scheduled: dict[Request, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    # Pass composition, for the timing model: a decode computes the last sampled token.
    num_prefill_tokens: int = 0
    num_decodes: int = 0
    # Prefix-cache accounting of the requests admitted in this pass (tokens).
    prefix_queries: int = 0
    prefix_hits: int = 0


def _is_decode(request: Request, num_new: int) -> bool:
    """A pass computes one token of this request: the last one it sampled (before the pass)."""
    num_tokens = len(request.all_token_ids)
    return (
        num_new == 1
        and request.num_computed_tokens == num_tokens - 1
        and num_tokens > request.num_prompt_tokens
    )


class Scheduler:
    """Decides each pass; allocates through the KV manager, never touches the pool directly."""

    __slots__ = (
        "_block_size",
        "_chunked",
        "_max_seqs",
        "_token_budget",
        "_victim",
        "kv",
        "num_preemptions",
        "running",
        "waiting",
    )

    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.kv = kv
        self.running: list[Request] = []
        self.waiting = WaitingQueue()
        self.num_preemptions = 0
        self._token_budget = config.max_num_batched_tokens
        self._max_seqs = config.max_num_seqs
        self._chunked = config.enable_chunked_prefill
        self._victim = config.preemption_victim
        self._block_size = config.block_size

    # -- queue changes ------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.push(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request wherever it is and free its blocks at once."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.kv.free(request)

    def remove_finished(self) -> None:
        """Drop finished requests from the running list (once per pass, O(running))."""
        self.running = [r for r in self.running if not r.is_finished]

    # -- the pass -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(self._token_budget, out)
        # As vLLM: a pass that had to preempt admits nobody new.
        if not out.preempted:
            self._schedule_waiting(budget, out)
        return out

    def _schedule_running(self, budget: int, out: SchedulerOutput) -> int:
        running = self.running
        scheduled = out.num_scheduled
        allocate = self.kv.allocate_slots
        bs = self._block_size
        prefill = decodes = 0
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            num_tokens = len(request.all_token_ids)
            computed = request.num_computed_tokens
            num_new = min(num_tokens - computed, budget)
            # Most decode steps stay inside the last block: skip the allocator then.
            if computed + num_new > len(request.blocks) * bs:
                while not allocate(request, num_new):
                    victim = self._pick_victim()
                    index = running.index(victim)
                    if victim in scheduled:  # only when the victim runs before `request`
                        n = scheduled.pop(victim)
                        budget += n
                        if _is_decode(victim, n):
                            decodes -= 1
                        else:
                            prefill -= n
                    self._preempt(victim, out)
                    if victim is request:
                        break
                    if index < i:
                        i -= 1
                if request.status != RequestStatus.RUNNING:
                    continue  # it was its own victim; the next request is now at index i
            scheduled[request] = num_new
            budget -= num_new
            if _is_decode(request, num_new):
                decodes += 1
            else:
                prefill += num_new
            i += 1
        out.num_prefill_tokens += prefill
        out.num_decodes += decodes
        return budget

    def _pick_victim(self) -> Request:
        """The lowest-priority running request (highest value, as vLLM's priority policy);
        among equals the newest (default) or the oldest."""
        running = self.running
        worst = max(r.priority for r in running)
        if self._victim is PreemptionVictim.OLDEST:
            return next(r for r in running if r.priority == worst)
        return next(r for r in reversed(running) if r.priority == worst)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Preemption by recompute: free everything, start over from the front of waiting."""
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push_front(request)
        out.preempted.append(request)

    def _schedule_waiting(self, budget: int, out: SchedulerOutput) -> None:
        waiting = self.waiting
        kv = self.kv
        bs = kv.block_size
        while budget > 0 and len(self.running) < self._max_seqs and waiting:
            request = waiting.peek()
            assert request is not None
            hits = kv.get_computed_blocks(request)
            num_hit = len(hits) * bs
            num_new = request.num_tokens - num_hit
            if num_new > budget:
                if not self._chunked:
                    break  # the whole prompt waits for a pass with room for it
                num_new = budget
            if not kv.allocate_slots(request, num_new, hits):
                break
            waiting.pop()
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit
                out.prefix_queries += request.num_tokens
                out.prefix_hits += num_hit
            request.num_computed_tokens = num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.admitted.append(request)
            out.num_scheduled[request] = num_new
            out.num_prefill_tokens += num_new
            budget -= num_new
