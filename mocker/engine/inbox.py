"""What callers post to the live engine loop: small typed messages, applied between passes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mocker.request import EngineRequest, RequestStatus

__all__ = [
    "AddRequest",
    "FinishEarly",
    "InboxMessage",
    "PreloadLora",
    "ResetPrefixCache",
    "TransfersDue",
]


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


@dataclass(frozen=True, slots=True)
class PreloadLora:
    """A LoRA adapter loaded at runtime (POST /v1/load_lora_adapter): into the CPU cache, as
    vLLM loads it, so its first use pays no disk read."""

    name: str


InboxMessage = AddRequest | FinishEarly | TransfersDue | ResetPrefixCache | PreloadLora
