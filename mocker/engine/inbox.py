"""What callers post to the live engine loop: small typed messages, applied between passes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mocker.request import EngineRequest, RequestStatus

__all__ = ["AddRequest", "FinishEarly", "InboxMessage", "ResetPrefixCache", "TransfersDue"]


@dataclass(frozen=True, slots=True)
class AddRequest:
    """A request accepted at the door (already checked), for the core."""

    spec: EngineRequest


@dataclass(frozen=True, slots=True)
class FinishEarly:
    """End a request outside a pass: an abort, or a stop string its consumer matched."""

    request_id: str
    status: RequestStatus


@dataclass(frozen=True, slots=True)
class TransfersDue:
    """The transfer timer saw the KV stack's deadline pass: apply what is due."""


@dataclass(frozen=True, slots=True)
class ResetPrefixCache:
    """Clear the device prefix cache; `done` gets the number of blocks cleared."""

    done: asyncio.Future[int]


InboxMessage = AddRequest | FinishEarly | TransfersDue | ResetPrefixCache
