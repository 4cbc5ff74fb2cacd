"""Each generated token of a request, and whether it ends the request (vLLM's order)."""

from __future__ import annotations

from mocker.output_tokens import OutputTokenSampler
from mocker.request import Request, RequestStatus

__all__ = ["next_token", "stop_status"]


def next_token(sampler: OutputTokenSampler, request: Request, k: int) -> int:
    """Output token `k` of the request: EOS may be drawn only once min_tokens are out and
    not with ignore_eos; while min_tokens is unmet a stop token id is masked (redrawn), as
    vLLM's sampler masks them."""
    sp = request.sampling
    tok = sampler.token(request.token_seed, k, not sp.ignore_eos and k >= sp.min_tokens)
    if k < sp.min_tokens and tok in sp.stop_token_ids:
        tok = sampler.token_avoiding(request.token_seed, k, sp.stop_token_ids)
    return tok


def stop_status(request: Request, tok: int, num_out: int, eos: int) -> RequestStatus | None:
    """The finished status after `num_out` output tokens, the last `tok`, or None."""
    # vLLM's order: the length cap wins, then min_tokens gates EOS and stop ids.
    if num_out >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    sp = request.sampling
    if num_out <= sp.min_tokens:
        return None
    if (tok == eos and not sp.ignore_eos) or tok in sp.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    return None
