"""What one engine step returns: new tokens per request, pass timing, stats and KV events."""

from __future__ import annotations

from dataclasses import dataclass, field

from mocker.kv.events import KVEvent
from mocker.request import FinishReason, Request
from mocker.tiers.offload import TransferRecord

__all__ = ["RequestOutput", "StepResult", "StepStats"]


@dataclass(slots=True)
class RequestOutput:
    """New tokens of one request from one pass (or its end)."""

    request_id: str
    new_token_ids: list[int]
    time: float  # when these tokens exist: the end of the pass that made them
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prefix hits, device and host
    num_host_cached_tokens: int = 0  # of which loaded from the host tier


@dataclass(frozen=True, slots=True)
class StepStats:
    """A snapshot after the step, for metrics and reports."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_scheduled_tokens: int
    prompt_tokens_computed: int  # prefill tokens computed this pass (cache hits excluded)
    num_generated_tokens: int
    num_preemptions: int  # preemptions this pass
    prefix_queries: int  # prompt tokens of requests admitted for the first time
    prefix_hits: int  # of which found in the device prefix cache
    external_prefix_queries: int = 0  # with a host tier: prompt tokens queried there
    external_prefix_hits: int = 0  # of which loaded from it


@dataclass(slots=True)
class StepResult:
    """One pass of the engine. `end - start` is its simulated duration."""

    start: float
    end: float
    outputs: list[RequestOutput]
    stats: StepStats
    finished: list[Request] = field(default_factory=list)
    kv_events: list[KVEvent] = field(default_factory=list)
    # Host-tier transfers that ended since the previous result.
    transfers: list[TransferRecord] = field(default_factory=list)

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
        return bool(self.transfers or self.kv_events or s.num_preemptions or s.prefix_queries)
