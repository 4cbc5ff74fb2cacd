"""The running requests' share of a pass: decodes and prefill chunks within the token budget."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from mocker.request import Request, RequestStatus
from mocker.scheduler.mamba_split import mamba_aligned
from mocker.scheduler.preemption import pick_victim, preempt
from mocker.scheduler.prefix_accounting import register

if TYPE_CHECKING:
    from mocker.scheduler.output import SchedulerOutput
    from mocker.scheduler.state import SchedulerState

__all__ = ["decodes_next", "schedule_running"]

_TOKEN_IDS = attrgetter("all_token_ids")


def decodes_next(request: Request) -> bool:
    """The request's next pass computes only its last sampled token (it is past its prompt)."""
    num_tokens = len(request.all_token_ids)
    return request.num_computed_tokens == num_tokens - 1 and num_tokens > request.num_prompt_tokens


def _is_decode(request: Request, num_new: int) -> bool:
    """A pass computes one token of this request: the last one it sampled (before the pass)."""
    return num_new == 1 and decodes_next(request)


def schedule_running(
    sched: SchedulerState, budget: int, out: SchedulerOutput, start: int = 0
) -> tuple[int, bool]:
    """Schedule the running requests in order, preempting for blocks: (budget left, stalled)."""
    # (From running request `start` on: those before it are the caller's, as in
    # `schedule_after_decodes`.)
    running = sched.running
    scheduled = out.num_scheduled
    allocate = sched.kv.allocate_slots
    bs = sched._block_size
    longest = sched._long
    prefill = decodes = prefill_reqs = prefill_ctx = decode_ctx = 0
    stalled = False
    chunks: list[tuple[Request, int]] | None = None  # prefill chunks that fill blocks
    i = start
    if sched.decode_head is not None and not sched._mamba_split:
        # The requests that decode one token, from the head on, in C: as this loop
        # schedules them (it goes on from the first that does not, or finds no room).
        i, budget, decodes = sched.decode_head(running, i, budget, scheduled, allocate)
        if sched.count_context and i > start:
            decode_ctx = sum(map(len, map(_TOKEN_IDS, running[start:i])))
    while i < len(running) and budget > 0:
        request = running[i]
        num_tokens = len(request.all_token_ids)
        computed = request.num_computed_tokens
        num_new = num_tokens - computed
        if num_new > budget:
            num_new = budget
        if num_new > longest:
            num_new = longest
        if sched._mamba_split:
            num_new = mamba_aligned(sched, request, computed, num_new)
            if not num_new:
                i += 1  # it waits for a pass with room to reach the next boundary
                continue
        # Most decode steps stay inside the last block: skip the allocator then (unless
        # a hybrid model's group releases a block now).
        if computed + num_new > len(request.blocks) * bs or computed >= request.kv_recheck:
            room = True
            while not allocate(request, num_new):
                if sched.kv.awaiting_displaced:
                    # Blocks are on their way back from copies to the CPU tier: wait
                    # for them rather than preempt (no capacity exists before then).
                    room = False
                    break
                victim = pick_victim(sched)
                index = running.index(victim)
                if victim in scheduled:  # only when the victim runs before `request`
                    n = scheduled.pop(victim)
                    budget += n
                    if _is_decode(victim, n):
                        decodes -= 1
                        decode_ctx -= len(victim.all_token_ids)
                    else:
                        prefill -= n
                        prefill_reqs -= 1
                        prefill_ctx -= victim.num_computed_tokens
                preempt(sched, victim, out)
                if victim is request:
                    break
                if index < i:
                    i -= 1
            if request.status != RequestStatus.RUNNING:
                continue  # it was its own victim; the next request is now at index i
            if not room:
                stalled = True
                i += 1
                continue  # it sits this pass out
        scheduled[request] = num_new
        budget -= num_new
        # _is_decode, inlined (once per running request per pass): `computed` is still
        # the request's, as allocation changed none of its counts.
        if num_new == 1 and computed == num_tokens - 1 and num_tokens > request.num_prompt_tokens:
            decodes += 1
            decode_ctx += num_tokens
        else:
            prefill += num_new
            prefill_reqs += 1
            prefill_ctx += computed
            if (computed + num_new) // bs > request.num_cached_blocks:
                if chunks is None:
                    chunks = []
                chunks.append((request, computed + num_new))
        i += 1
    out.num_prefill_tokens += prefill
    out.num_decodes += decodes
    out.prefill_requests += prefill_reqs
    out.prefill_context += prefill_ctx
    if sched.count_context:
        out.decode_context += decode_ctx
    # Prefill chunks register their blocks once every running request is placed: a
    # victim of the priority policy or of --preemption-victim oldest may have been
    # scheduled earlier in this loop (no lookup happens before the loop ends, so the
    # requests admitted after it hit the same blocks).
    if chunks is not None:
        for request, num_tokens in chunks:
            if request in scheduled:
                register(sched, request, num_tokens, out)
    return budget, stalled
