"""Where a Mamba model's prefill chunk ends: on block boundaries, where its state is saved."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mocker.request import Request
    from mocker.scheduler.state import SchedulerState

__all__ = ["mamba_aligned"]


def mamba_aligned(sched: SchedulerState, request: Request, start: int, num_new: int) -> int:
    """vLLM's _mamba_block_aligned_split: a prefill chunk ends on a block boundary (its
    Mamba state is saved there), never runs past the last boundary before the prompt's
    end (the state a later prompt with this prefix can hit) nor past a prefix other
    requests share, and one that starts mid-block stops at the next boundary. The
    prompt's last chunk is exempt."""
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if start >= prefill_end:
        return num_new
    bs = sched._block_size
    end = start + num_new
    if end < prefill_end:
        aligned = end // bs * bs
        if aligned > start or bs <= sched._token_budget:
            end = aligned
    last_cache = (request.num_tokens - 1) // bs * bs
    chunk = sched._chunk
    next_chunk = (start // chunk + 1) * chunk if chunk else 0
    # The shared-prefix junction (block-floored): its state saved, later requests that
    # share the prefix hit it (vLLM's Marconi-style stop).
    junction = request.shared_prefix_boundary
    shared = start + (junction - start) // bs * bs if start < junction < end else 0
    for stop in ((start // bs + 1) * bs if start % bs else 0, last_cache, next_chunk, shared):
        if start < stop < end:
            end = stop
    return max(end - start, 0)
