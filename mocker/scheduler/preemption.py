"""Preemption by recompute: which running request gives way, and how it starts over."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mocker.config_choices import PreemptionVictim
from mocker.request import Request, RequestStatus

if TYPE_CHECKING:
    from mocker.scheduler.output import SchedulerOutput
    from mocker.scheduler.state import SchedulerState

__all__ = ["pick_victim", "preempt"]


def _priority_key(request: Request) -> tuple[int, float]:
    return request.priority, request.arrival_time


def pick_victim(sched: SchedulerState) -> Request:
    """vLLM's victim: under the priority policy the running request with the highest
    (priority, arrival time), the first such in running order; under fcfs (every
    priority 0) the newest running (`running.pop()`), or with --preemption-victim
    oldest the oldest."""
    running = sched.running
    if sched._by_priority:
        return max(running, key=_priority_key)
    if sched._victim is PreemptionVictim.OLDEST:
        return running[0]
    return running[-1]


def preempt(sched: SchedulerState, request: Request, out: SchedulerOutput) -> None:
    """Preemption by recompute: free everything, start over from the front of waiting."""
    sched.running.remove(request)
    sched.kv.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    sched.num_preemptions += 1
    sched.waiting.push_front(request)
    out.preempted.append(request)
