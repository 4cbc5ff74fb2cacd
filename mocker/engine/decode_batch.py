"""Replay's fast path for small engines: a run of passes in which every running request only
decodes, applied in one call, the same as pass by pass."""

from __future__ import annotations

from dataclasses import dataclass
from operator import sub

from mocker.engine.core import EngineCore
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.manager import KVCacheManager
from mocker.request import Request, RequestStatus

__all__ = ["DecodeRun", "batch_run", "batchable", "ends_at_max_tokens"]


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """Passes run by `DecodeRuns.run`: when the last ended, how many, who finished."""

    end: float
    passes: int
    finished: list[FinishedRequestStats]


def batchable(core: EngineCore) -> bool:
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


def _plain(core: EngineCore, batch: list[Request]) -> bool:
    """Whether every one of these ends at max_tokens (no EOS can be drawn, no stop ids)."""
    early = core.sampler.can_end_early
    return all(ends_at_max_tokens(request, early) for request in batch)


def ends_at_max_tokens(request: Request, eos_possible: bool) -> bool:
    """No stop ids, and no EOS drawn (none can be, or it is ignored): its last pass is known."""
    sp = request.sampling
    return not sp.stop_token_ids and (sp.ignore_eos or not eos_possible)


def batch_run(core: EngineCore, now: float, stop_at: float) -> DecodeRun | None:
    """Consecutive passes from `now` while each is every running request decoding one token.
    None if the next pass is not such a pass.

    The passes are the ones `step()` would run, with the same timings and the same pool
    operations in the same order, minus the outputs, stats and events: blocks are
    handed out pass by pass in running order, then each request takes its tokens at
    once. The run ends after the first pass in which a request finishes, that ends at
    or after `stop_at`, or before a pass that would have to preempt. Only for requests
    that end at max_tokens (no EOS drawn, no stop ids), whose finishing pass is known.
    """
    if not batchable(core):
        return None
    batch = core.scheduler.decode_batch()
    if batch is None or not _plain(core, batch):
        return None
    # (Each request's output count once: `num_output_tokens` is a property, and these run
    # for every request of every run.)
    outputs = [len(r.all_token_ids) - r.num_prompt_tokens for r in batch]
    max_passes = min(map(sub, [r.max_tokens for r in batch], outputs))
    allocs = _block_needs(batch, core.config.block_size, max_passes)
    passes, start, end = _time_passes(core, batch, allocs, now, stop_at, max_passes)
    if not passes:
        return None
    marks = [(len(r.all_token_ids), len(r.block_hashes)) for r in batch]
    # Tokens (and block hashes) first: no pool state changes yet.
    rows = core.sampler.token_rows([r.token_seed for r in batch], outputs, passes)
    for request, row in zip(batch, rows, strict=True):
        request.append_output_tokens(row)
    if _would_dedup(core, batch, passes):
        for request, (num_tokens, num_hashes) in zip(batch, marks, strict=True):
            del request.all_token_ids[num_tokens:]
            del request.block_hashes[num_hashes:]
        return None
    core.time = max(core.time, start)
    return DecodeRun(end, passes, _apply(core, batch, allocs, passes, end))


def _block_needs(batch: list[Request], bs: int, max_passes: int) -> dict[int, list[Request]]:
    """Passes at which each request needs a new block (its next position starts one)."""
    allocs: dict[int, list[Request]] = {}
    for request in batch:
        first = len(request.blocks) * bs - request.num_computed_tokens + 1
        if first > max_passes:
            continue  # (most requests in a short run: no range to make)
        for p in range(max(first, 1), max_passes + 1, bs):
            allocs.setdefault(p, []).append(request)
    return allocs


def _time_passes(
    core: EngineCore,
    batch: list[Request],
    allocs: dict[int, list[Request]],
    now: float,
    stop_at: float,
    max_passes: int,
) -> tuple[int, float, float]:
    """How many passes run, and the start and end of the last one."""
    reusable, used = core.kv.num_reusable, core.kv.num_used
    shape_used, duration = -1, 0.0
    passes, start, end = 0, now, now
    context = core.timing.reads_context
    # Pass p (from 1) reads each request's computed tokens before the run, p - 1 more, and
    # the one it computes.
    computed = sum(r.num_computed_tokens for r in batch) if context else 0
    n = len(batch)
    same_until = 0  # (context: the first pass whose time may differ)
    for p in range(1, max_passes + 1):
        need = allocs.get(p)
        if need:
            if len(need) > reusable:
                break  # step() would preempt here
            reusable -= len(need)
            used += len(need)
        if context:
            if p >= same_until:
                duration, span = core.decode_pass(n, used, computed + n * p)
                same_until = p + span
        elif used != shape_used:  # (else its time depends on these alone)
            shape_used = used
            duration = core.pass_duration(0, n, used, prefill_requests=0, prefill_context=0,
                                          decode_context=0)  # fmt: skip
        start, end, passes = end, end + duration, p
        if end >= stop_at:
            break
    return passes, start, end


def _apply(
    core: EngineCore,
    batch: list[Request],
    allocs: dict[int, list[Request]],
    passes: int,
    end: float,
) -> list[FinishedRequestStats]:
    """The pool operations of the passes, in step()'s order; the requests that finished."""
    kv = core.kv
    assert isinstance(kv, KVCacheManager)  # (a hybrid model's passes are stepped)
    # Blocks handed out pass by pass in running order: one take from the pool, dealt out.
    order = [r for p in sorted(allocs) if p <= passes for r in allocs[p]]
    if order:
        kv.append_block_each(order)
    finished: list[FinishedRequestStats] = []
    bs = core.config.block_size
    for request in batch:
        computed = request.num_computed_tokens + passes
        request.num_computed_tokens = computed
        request.last_token_time = end
        if computed // bs > request.num_cached_blocks:  # (kv.cache_blocks' own test, first)
            kv.cache_blocks(request)
        if len(request.all_token_ids) - request.num_prompt_tokens >= request.max_tokens:
            finished.append(core.finish_in_pass(request, RequestStatus.FINISHED_LENGTH_CAPPED, end))
    if finished:
        core.scheduler.remove_finished()
    return finished


def _would_dedup(core: EngineCore, batch: list[Request], passes: int) -> bool:
    """Whether a block the run fills has a hash already cached (or filled twice in it).
    `step()` would then swap in the cached block in mid-run, freeing one and changing
    the pool's order and usage; the run leaves those passes to `step()`. (Generated
    tokens make this all but impossible, except with tiny vocabularies or blocks.)"""
    if not core.config.cache.enable_prefix_caching:
        return False
    lookup, bs = core.pool.lookup, core.config.block_size
    seen: set[int] = set()
    for request in batch:
        end = (request.num_computed_tokens + passes) // bs
        if end <= request.num_cached_blocks:
            continue  # (most requests in a short run: no block fills, no slice to make)
        for block_hash in request.block_hashes[request.num_cached_blocks : end]:
            if block_hash in seen or lookup(block_hash) is not None:
                return True
            seen.add(block_hash)
    return False
