"""What a generation request's headers say beyond its body (no mocker.api imports: a leaf)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestHeaders"]


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    """What a generation request's headers say beyond its body."""

    request_id: str | None = None  # X-Request-Id
    rank: str | None = None  # X-data-parallel-rank, as sent
    fault: str | None = None  # X-Mocker-Fail
    session: str | None = None  # X-Session-ID
