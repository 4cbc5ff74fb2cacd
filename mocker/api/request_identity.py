"""Where a request runs and whose it is: the data-parallel rank it pins, its session."""

from __future__ import annotations

from mocker.api.errors import OpenAIError
from mocker.api.request_checks import GenerationRequest

__all__ = ["pinned_rank", "session_of"]


def pinned_rank(field: int | None, header: str | None) -> int | None:
    """The data-parallel rank a request pins: its `data_parallel_rank` field or vLLM's
    X-data-parallel-rank header (they must agree when both are given). As vLLM, a header
    that is not an integer is ignored: the request is load-balanced."""
    rank = None
    if header is not None:
        try:
            rank = int(header)
        except ValueError:
            rank = None
    if field is not None:
        if rank is not None and rank != field:
            raise OpenAIError(
                400,
                f"data_parallel_rank {field} and X-data-parallel-rank {rank} disagree.",
                "data_parallel_rank",
            )
        rank = field
    return rank


def session_of(body: GenerationRequest, header: str | None) -> str | None:
    """A request's session as vLLM 0.34 takes it: the body's `session_id`, else the
    X-Session-ID header, else `vllm_xargs.session_id` (the first non-empty one)."""
    if body.session_id:
        return body.session_id
    if header:
        return header
    xarg = (body.vllm_xargs or {}).get("session_id")
    return xarg if isinstance(xarg, str) and xarg else None
