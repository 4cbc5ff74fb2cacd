"""What one engine step returns: new tokens per request, pass timing, stats and KV events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from mocker.disagg.pulls import PullRecord
from mocker.engine.stats import FinishedRequestStats, IterationStats, SchedulerStats
from mocker.kv.events import KVEvent
from mocker.request import FinishReason, Request
from mocker.tiers.transfers import TransferRecord

__all__ = ["RequestOutput", "StepResult", "iteration_stats"]


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
    def worth_reporting(self) -> bool:
        """An idle result still carries something observers count."""
        s = self.stats
        return bool(
            self.transfers or self.pulls or self.kv_events or s.num_preemptions
            or s.prefix_queries
        )  # fmt: skip


_NEW_TOKEN_IDS = attrgetter("new_token_ids")


def iteration_stats(outputs: Sequence[RequestOutput]) -> IterationStats:
    """A pass's delivered outputs as vLLM's IterationStats."""
    # Once per pass over every delivered output: comprehensions and C-level sums, with
    # a loop only over the (few) outputs that carry a request's first token.
    stats = IterationStats()
    stats.num_generation_tokens = sum(map(len, map(_NEW_TOKEN_IDS, outputs)))
    stats.inter_token_latencies = [
        out.latency for out in outputs if not out.first_token and out.new_token_ids
    ]
    for out in [out for out in outputs if out.first_token and out.new_token_ids]:
        stats.num_prompt_tokens += out.num_prompt_tokens
        stats.num_cached_tokens += out.num_cached_tokens
        for tier, n in out.tier_hits:
            stats.tier_cached[tier] = stats.tier_cached.get(tier, 0) + n
        stats.time_to_first_tokens.append(out.latency)
    return stats
