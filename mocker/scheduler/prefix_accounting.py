"""A pass's prefix-cache bookkeeping: blocks registered as scheduled, hits counted once."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mocker.request import Request
    from mocker.scheduler.output import SchedulerOutput
    from mocker.scheduler.state import SchedulerState

__all__ = ["count_prefix", "register"]


def register(
    sched: SchedulerState, request: Request, num_tokens: int, out: SchedulerOutput
) -> None:
    """Register the full blocks this pass computes for the request now, as vLLM's
    allocate_slots does before the forward pass: a request scheduled after it in this
    pass with the same prefix (another choice of n, a burst of one system prompt) hits
    them rather than computing them again."""
    kv = sched.kv
    if not kv.enable_caching:
        return  # (the pass's end counts the blocks, as it always did)
    before = request.num_cached_blocks
    kv.cache_blocks(request, min(num_tokens, request.num_tokens))
    if request.num_cached_blocks > before:
        if out.registered is None:
            out.registered = {}
        out.registered.setdefault(request, before)


def count_prefix(
    sched: SchedulerState, request: Request, device: int, tiers: int, out: SchedulerOutput
) -> None:
    """Prefix-cache accounting, once per request: at its first admission (what each tier
    contributed is in `request.tier_hits`, set by the connector when the load started)."""
    if request.num_cached_tokens >= 0:
        return
    request.num_cached_tokens = device + tiers
    out.prefix_queries += request.num_tokens
    out.prefix_hits += device
    if sched._external:
        out.external_queries += request.num_tokens
        out.external_hits += tiers
        if tiers:
            by_tier = out.external_by_tier
            if by_tier is None:
                by_tier = out.external_by_tier = {}
            for tier, n in request.tier_hits:
                by_tier[tier] = by_tier.get(tier, 0) + n
