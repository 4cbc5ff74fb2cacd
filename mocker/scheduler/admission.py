"""Admissions into a pass: resumed requests whose KV loaded, then waiting ones (or their loads)."""

from __future__ import annotations

from collections.abc import Sized
from typing import TYPE_CHECKING

from mocker.request import Request, RequestStatus
from mocker.scheduler.deferral import batch_loras, over_max_loras
from mocker.scheduler.mamba_split import mamba_aligned
from mocker.scheduler.prefix_accounting import count_prefix, register

if TYPE_CHECKING:
    from mocker.scheduler.output import SchedulerOutput
    from mocker.scheduler.state import SchedulerState

__all__ = ["schedule_ready", "schedule_waiting"]


def _admit(sched: SchedulerState, request: Request, num_new: int, out: SchedulerOutput) -> None:
    request.status = RequestStatus.RUNNING
    sched.running.append(request)
    out.admitted.append(request)
    out.num_scheduled[request] = num_new
    out.num_prefill_tokens += num_new
    out.prefill_requests += 1
    out.prefill_context += request.num_computed_tokens
    register(sched, request, request.num_computed_tokens + num_new, out)


def _chunk_aligned_lookup(
    sched: SchedulerState, request: Request, hits: Sized
) -> tuple[Sized, int | None]:
    """A hybrid model's device hit that ends inside a tier chunk: the longest hit valid in
    every group up to the chunk boundary before it, continued by the tier if together
    they reach past the device hit (the rest is recomputed); else the device hit alone
    (and the tier forgets what it kept for the request). None: retry later."""
    connector, unit = sched.connector, sched._unit
    assert connector is not None
    cut = sched.kv.get_computed_blocks(request, len(hits) // unit * unit)
    if len(cut) % unit:
        connector.skip_lookup(request)
        return hits, 0
    matched = connector.num_matched_blocks(request, len(cut) // unit)
    if matched is None or len(cut) + matched * unit > len(hits):
        return cut, matched
    connector.skip_lookup(request)
    return hits, 0


def schedule_ready(sched: SchedulerState, budget: int, out: SchedulerOutput) -> int:
    """Resume requests whose KV loaded, in the order their loads ended."""
    ready = sched.ready
    if not ready:
        return budget
    loras = batch_loras(sched)
    i = 0
    while i < len(ready) and budget > 0 and len(sched.running) < sched._max_seqs:
        request = ready[i]
        lora = request.lora_name
        if over_max_loras(sched, loras, lora):
            i += 1  # its adapter waits for a slot; the next resumes (as in waiting)
            continue
        num_new = min(request.num_tokens - request.num_computed_tokens, sched._long)
        if num_new > budget:
            if not sched._chunked:
                break
            num_new = budget
        if sched._mamba_split:
            num_new = mamba_aligned(sched, request, request.num_computed_tokens, num_new)
            if not num_new:
                break
        if not sched.kv.allocate_slots(request, num_new):
            break
        ready.pop(i)
        _admit(sched, request, num_new, out)
        budget -= num_new
        if loras is not None and lora is not None:
            loras.add(lora)
    return budget


def schedule_waiting(sched: SchedulerState, budget: int, out: SchedulerOutput) -> None:
    """Admit waiting requests in order, starting loads for those a tier holds. None while
    a request whose KV loaded still waits to resume: it comes first (vLLM stops at the
    first waiting request it cannot allocate), and a fresh admission would take the
    blocks it waits for, among them those `unblock` just freed for it."""
    sched.num_deferred = 0
    if sched.ready:
        loras = batch_loras(sched)
        if any(not over_max_loras(sched, loras, r.lora_name) for r in sched.ready):
            return
        # Every one of them waits for an adapter slot: the queue goes on (as vLLM's).
    waiting = sched.waiting
    kv, connector = sched.kv, sched.connector
    sync = connector.sync_loads if connector is not None else None  # (LMCache's loads)
    bs = kv.block_size
    unit = sched._unit
    skipped: list[tuple[Request, int]] = []
    loras = batch_loras(sched)
    while budget > 0 and len(sched.running) < sched._max_seqs and waiting:
        request = waiting.peek()
        assert request is not None
        lora = request.lora_name
        if over_max_loras(sched, loras, lora):
            # Its adapter would exceed max_loras: it waits, keeping its place, and the
            # requests behind it go on (vLLM skips it, not the queue).
            skipped.append(waiting.pop_entry())
            continue
        hits = kv.get_computed_blocks(request)
        num_hit = len(hits) * bs
        if request.remote_prefill is not None and sched.pulls is not None:
            # P/D decode side: the rest of the prompt is pulled from the prefill engine
            # (all of it, as vLLM's NixlConnector; a local hit is not pulled again).
            num_pulled = request.num_prompt_tokens - num_hit
            if not kv.allocate_slots(request, num_pulled, hits):
                break
            waiting.pop()
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            request.load_hits = (num_hit, num_pulled)
            sched.loading.add(request)
            out.pulls.append((request, len(request.blocks) - len(hits)))
            continue
        num_loaded = 0  # tier units (blocks; a hybrid model's chunks of `unit` blocks)
        # (prompt logprobs: no hit from the tiers either, their tokens are computed)
        if connector is not None and not request.skip_reading_prefix_cache:
            if len(hits) % unit:
                # A hybrid device hit that ends inside a chunk: the tier continues from a
                # chunk boundary, so the hit is cut back to one if that gains tokens.
                hits, matched = _chunk_aligned_lookup(sched, request, hits)
                num_hit = len(hits) * bs
            else:
                matched = connector.num_matched_blocks(request, len(hits) // unit)
            if matched is None:
                # Retry later (its KV is being promoted to the CPU tier): it keeps its
                # place, and the requests behind it go on (vLLM skips it this pass).
                skipped.append(waiting.pop_entry())
                continue
            num_loaded = matched
        if num_loaded and sync is None:
            # Reserve device slots for the tier's blocks and park the request until its
            # KV has loaded; it needs no budget until then.
            loaded_tokens = num_loaded * unit * bs
            if not kv.allocate_slots(request, loaded_tokens, hits, loaded=True):
                break
            waiting.pop()
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            request.load_hits = (num_hit, loaded_tokens)
            sched.loading.add(request)
            out.loads.append((request, len(hits) // unit, num_loaded))
            continue
        # (LMCache's synchronous loads: the pass admitting it copies its tier hit first,
        # as computed tokens that use no budget.)
        loaded_tokens = num_loaded * unit * bs
        num_new = min(request.num_tokens - num_hit - loaded_tokens, sched._long)
        if num_new > budget:
            if not sched._chunked:
                break  # the whole prompt waits for a pass with room for it
            num_new = budget
        if sched._mamba_split:
            num_new = mamba_aligned(sched, request, num_hit + loaded_tokens, num_new)
            if not num_new:
                break
        if not kv.allocate_slots(request, loaded_tokens + num_new, hits):
            break
        waiting.pop()
        if sync is not None:  # (LMCache: what its worker counts)
            if loaded_tokens:
                sync.admit(request, len(hits) // unit, num_loaded)
            sync.scheduled(request, num_hit, num_hit + loaded_tokens + num_new)
        count_prefix(sched, request, num_hit, loaded_tokens, out)
        request.num_computed_tokens = num_hit + loaded_tokens
        _admit(sched, request, num_new, out)
        budget -= num_new
        if loras is not None and lora is not None:
            loras.add(lora)
    sched.num_deferred = len(skipped)
    for request, order in skipped:
        waiting.restore(request, order)
