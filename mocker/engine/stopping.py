"""Each generated token of a request, and whether it ends the request (vLLM's order)."""

from __future__ import annotations

from mocker.output_tokens import OutputTokenSampler
from mocker.request import Request, RequestStatus

__all__ = ["DRAW_AHEAD", "DRAW_MIN", "DRAW_STAGGER", "draw", "stop_status", "unmasked"]

# Tokens drawn ahead at once, and the fewest worth an array computation (below it the
# scalar draw is cheaper: numpy's fixed cost, a few tens of µs, is that of about ten scalar
# draws, and an element costs little more). Only a request that stops early (EOS, a stop
# id) leaves drawn tokens unused where every pass is stepped; a replay, whose decode runs
# draw their own tokens, draws one at a time instead (EngineCore._advance).
DRAW_AHEAD = 256
DRAW_MIN = 12
# A request's first window is shorter by its seed modulo this: requests that start together
# (a load generator's N concurrent streams) then draw their next windows in different passes,
# instead of all in one pass that would stall every stream once every DRAW_AHEAD tokens.
DRAW_STAGGER = DRAW_AHEAD // 2


def draw(sampler: OutputTokenSampler, request: Request, k: int) -> int:
    """Output token `k` of `request` (EOS possible once min_tokens are out, unless ignored):
    the pass reads `request.drawn` inline and calls this when k is not in it. Draws the
    request's next tokens, up to its max_tokens, into `request.drawn` (as one array when
    there are DRAW_MIN or more)."""
    sp = request.sampling
    eos_from = (1 << 62) if sp.ignore_eos else sp.min_tokens
    window = DRAW_AHEAD
    if request.drawn is None:  # its first draw: a window of its own length (DRAW_STAGGER)
        window -= request.token_seed % DRAW_STAGGER
    count = max(1, min(window, request.max_tokens - k))
    seed = request.token_seed
    if count < DRAW_MIN:  # one by one, still all at once
        token = sampler.token
        drawn = [token(seed, i, i >= eos_from) for i in range(k, k + count)]
    else:
        drawn = sampler.draws(seed, k, count, eos_from)
    request.drawn, request.drawn_from = drawn, k
    return drawn[0]


def unmasked(sampler: OutputTokenSampler, request: Request, k: int) -> int:
    """Output token `k` redrawn outside the stop token ids: while min_tokens is unmet vLLM's
    sampler masks them (and EOS), so the engine, which draws EOS only once min_tokens are
    out, redraws a stop id it drew before then."""
    return sampler.token_avoiding(request.token_seed, k, request.sampling.stop_token_ids)


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
