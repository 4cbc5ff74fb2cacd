"""A scheduling pass's result: tokens per request, preemptions, admissions, loads, counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from mocker.request import Request

__all__ = ["SchedulerOutput"]


@dataclass(slots=True)
class SchedulerOutput:
    """One pass: tokens to compute per request, and what changed to make room."""

    num_scheduled: dict[Request, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    # Tier loads to start: (request, first block, number of blocks); the device slots
    # are reserved and the request waits for its KV (WAITING_FOR_REMOTE_KVS).
    loads: list[tuple[Request, int, int]] = field(default_factory=list)
    # P/D pulls to start: (request, number of blocks); the device slots are reserved.
    pulls: list[tuple[Request, int]] = field(default_factory=list)
    # Pass composition, for the timing model: a decode computes the last sampled token and
    # reads every token before it; a prefill chunk reads the tokens before it.
    num_prefill_tokens: int = 0
    num_decodes: int = 0
    prefill_requests: int = 0
    prefill_context: int = 0
    decode_context: int = 0  # summed only when `Scheduler.count_context` (else 0)
    # Prefix-cache accounting of the requests admitted in this pass (tokens).
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0  # with tiers below the device: prompt tokens queried there
    external_hits: int = 0  # of which loaded from them
    # Of those, the tokens each tier supplied (None until one did).
    external_by_tier: dict[str, int] | None = None
    # Requests whose blocks this pass computes were registered in the prefix cache as they
    # were scheduled (vLLM's allocate_slots caches them before the forward pass, so a
    # request admitted later in the same pass hits them): how many blocks each had
    # registered before, for the store policy at the pass's end.
    # (None until one is: most passes register nothing)
    registered: dict[Request, int] | None = None
