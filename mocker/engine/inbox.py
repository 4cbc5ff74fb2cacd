"""What callers post to the live engine loop: small typed messages, applied between passes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mocker.request import EngineRequest, RequestStatus

__all__ = [
    "AddRequest",
    "ExtendHolds",
    "FinishEarly",
    "InboxMessage",
    "PreloadLora",
    "PullAnswered",
    "ReleaseHold",
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
    """Clear the device prefix cache; `done` gets the number of blocks cleared (None: a
    `whole` reset refused, some block being referenced). See EngineCore.reset_prefix_cache."""

    done: asyncio.Future[int | None]
    whole: bool = False
    reset_running: bool = False


@dataclass(frozen=True, slots=True)
class PreloadLora:
    """A LoRA adapter loaded at runtime (POST /v1/load_lora_adapter): into the CPU cache, as
    vLLM loads it, so its first use pays no disk read."""

    name: str


@dataclass(frozen=True, slots=True)
class ReleaseHold:
    """P/D prefill side: a decode engine read a held request's KV (or gave up on it); `done`
    gets whether it was still held."""

    hold_id: str  # the remote_request_id the prefill engine answered with
    done: asyncio.Future[bool]


@dataclass(frozen=True, slots=True)
class ExtendHolds:
    """P/D prefill side: a decode engine's heartbeat for holds it still wants."""

    hold_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PullAnswered:
    """P/D decode side: the prefill engine's answer to a pull's read notification."""

    request_id: str
    ok: bool


InboxMessage = (
    AddRequest
    | FinishEarly
    | TransfersDue
    | ResetPrefixCache
    | PreloadLora
    | ReleaseHold
    | ExtendHolds
    | PullAnswered
)
