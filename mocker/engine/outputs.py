"""What one engine step returns: new tokens per request, pass timing, stats and KV events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mocker.disagg.pulls import PullRecord
from mocker.engine.stats import FinishedRequestStats, SchedulerStats
from mocker.kv.events import KVEvent
from mocker.request import FinishReason, Request
from mocker.tiers.transfers import TransferRecord

__all__ = ["RequestOutput", "StepResult"]


@dataclass(slots=True)
class RequestOutput:
    """New tokens of one request from one pass (or its end)."""

    request_id: str
    new_token_ids: list[int]
    time: float  # when these tokens exist: the end of the pass that made them
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prefix hits, device and tiers
    tier_hits: tuple[tuple[str, int], ...] = ()  # of which loaded from each tier
    # Its first token: `latency` is then the time since arrival (TTFT), else the time
    # since the request's previous token (ITL).
    first_token: bool = False
    latency: float = 0.0
    # P/D prefill side, on a held request's final output: where a decode engine pulls it.
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def num_tier_cached_tokens(self) -> int:
        return sum(n for _, n in self.tier_hits)

    @classmethod
    def final(cls, request: Request, now: float) -> RequestOutput:
        """The no-token output that ends a request outside a pass (abort, stop string)."""
        return cls(
            request_id=request.request_id,
            new_token_ids=[],
            time=now,
            finished=True,
            finish_reason=request.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            tier_hits=request.tier_hits,
        )


@dataclass(slots=True)
class StepResult:
    """One pass of the engine. `end - start` is its simulated duration."""

    start: float
    end: float
    outputs: list[RequestOutput]
    stats: SchedulerStats
    finished: list[FinishedRequestStats] = field(default_factory=list)
    kv_events: list[KVEvent] = field(default_factory=list)
    # Transfers between tiers that ended since the previous result.
    transfers: list[TransferRecord] = field(default_factory=list)
    # P/D pulls that ended since the previous result (decode side).
    pulls: list[PullRecord] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def idle(self) -> bool:
        """No pass ran: nothing was schedulable (e.g. every request waits for a transfer)."""
        return self.stats.num_scheduled_tokens == 0

    @property
    def newsworthy(self) -> bool:
        """An idle result still carries something observers count."""
        s = self.stats
        return bool(
            self.transfers or self.pulls or self.kv_events or s.num_preemptions
            or s.prefix_queries
        )  # fmt: skip
