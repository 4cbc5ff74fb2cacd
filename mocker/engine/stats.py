"""Plain stats records the engine emits: per pass, per finished request, and a state snapshot.

As vLLM's `SchedulerStats` / `IterationStats` / `FinishedRequestStats`: observers (the
Prometheus metrics, replay reports) read these records, never live requests or the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mocker.request import FinishReason

if TYPE_CHECKING:
    from mocker.request import Request
    from mocker.scheduler.output import SchedulerOutput

__all__ = [
    "EngineSnapshot",
    "FinishedRequestStats",
    "IterationStats",
    "SchedulerStats",
    "queue_score",
]


def queue_score(num_waiting: int, num_running: int) -> int:
    """How loaded an engine's queues are, as vLLM's data-parallel front end scores its
    engines: a waiting request counts four times, a running one once (lower is less
    loaded). Shared by the data-parallel group and the replay router."""
    return 4 * num_waiting + num_running


@dataclass(frozen=True, slots=True)
class TierSnapshot:
    """One secondary tier as one engine sees it: usage, and that engine's cumulative
    lookups and failed jobs there (vLLM's tiering counters)."""

    name: str
    usage: float
    block_queries: int = 0
    block_hits: int = 0
    promotion_failures: int = 0
    cascade_failures: int = 0
    # vLLM 0.34's: promotions from it and cascades to it in flight, and the share of the
    # CPU tier their copies write (promotions) and read (cascades).
    active_promotions: int = 0
    active_cascades: int = 0
    primary_write_usage: float = 0.0
    primary_read_usage: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """A read-only view of one engine's state at one instant (gauges, routing, samples)."""

    num_running: int
    num_waiting: int
    kv_usage: float  # vLLM's kv_cache_usage_perc, 0..1
    cpu_usage: float = 0.0  # CPU tier: used / capacity
    # The CPU tier's share pinned by loads to the device and by stores landing in it.
    cpu_read_usage: float = 0.0
    cpu_write_usage: float = 0.0
    num_unfinished: int = 0  # requests the engine holds (running, waiting, loading)
    num_used_blocks: int = 0  # device blocks referenced by requests
    stores_skipped: int = 0  # blocks the CPU tier had no room for (vLLM's counter)
    tiers: tuple[TierSnapshot, ...] = ()  # the secondary tiers, in lookup order
    primary: TierSnapshot | None = None  # with secondary tiers: the CPU tier, as one
    # Waiting requests held by something other than room (vLLM 0.34's "deferred"): loading
    # their KV, or passed over for a LoRA slot or a promotion in the last pass.
    num_deferred: int = 0
    # vLLM's engine_sleep_state series (awake unless a sleep said otherwise).
    sleep_state: tuple[tuple[str, float], ...] = (
        ("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)
    )  # fmt: skip
    # With --enable-lora: the adapters of unfinished requests, oldest request first.
    lora_adapters: tuple[str, ...] = ()
    kv_expired: int = 0  # P/D prefill side: holds that expired unread (cumulative)
    # P/D decode side, vLLM's async KV load stages: waiting to start, in progress, loaded
    # and waiting to run.
    kv_fetch: tuple[int, int, int] = (0, 0, 0)
    # Hybrid models: each KV cache group's share of the pool in use (sums to kv_usage but
    # for displaced blocks; empty for a dense model).
    group_usage: tuple[float, ...] = ()

    @property
    def queue_score(self) -> int:
        return queue_score(self.num_waiting, self.num_running)


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """What one pass scheduled and what the scheduler's queues hold after it."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_scheduled_tokens: int
    prompt_tokens_computed: int  # prefill tokens computed this pass (cache hits excluded)
    num_generated_tokens: int
    num_preemptions: int  # preemptions this pass
    prefix_queries: int  # prompt tokens of requests admitted for the first time
    prefix_hits: int  # of which found in the device prefix cache
    external_prefix_queries: int = 0  # with tiers: prompt tokens queried there
    external_prefix_hits: int = 0  # of which loaded from it
    external_hits_by_tier: Mapping[str, int] | None = None  # those hits, by tier

    @classmethod
    def of(
        cls,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        sched: SchedulerOutput | None = None,
        num_generated: int = 0,
    ) -> SchedulerStats:
        """After a pass that scheduled `sched` (None: no pass ran)."""
        if sched is None:
            return cls(num_running, num_waiting, kv_usage, 0, 0, 0, 0, 0, 0)
        return cls(
            num_running=num_running,
            num_waiting=num_waiting,
            kv_usage=kv_usage,
            num_scheduled_tokens=sched.num_prefill_tokens + sched.num_decodes,
            prompt_tokens_computed=sched.num_prefill_tokens,
            num_generated_tokens=num_generated,
            num_preemptions=len(sched.preempted),
            prefix_queries=sched.prefix_queries,
            prefix_hits=sched.prefix_hits,
            external_prefix_queries=sched.external_queries,
            external_prefix_hits=sched.external_hits,
            external_hits_by_tier=sched.external_by_tier,
        )


@dataclass(slots=True)
class IterationStats:
    """The tokens one pass handed out (its delivered outputs): counts and latencies.

    Prompt counts are taken from each request's first output, as vLLM's PromptTokenStats
    (prompt_tokens_cached and, by tier, prompt_tokens_cached_by_source, whose totals
    match): a request aborted before its first token adds nothing here, though its hits were
    counted by `SchedulerStats` at admission (prefix and external prefix cache hits)."""

    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0  # of requests whose first token this pass made
    num_cached_tokens: int = 0  # of those prompts, prefix hits (device and tiers)
    tier_cached: dict[str, int] = field(default_factory=dict)  # of which from each tier
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FinishedRequestStats:
    """One request at its end: its times on the engine's clock and its token counts."""

    request_id: str
    finish_reason: FinishReason
    arrival_time: float
    finished_time: float
    first_scheduled_time: float | None  # None: never scheduled (aborted while waiting)
    first_token_time: float | None
    num_prompt_tokens: int
    num_generation_tokens: int
    max_tokens: int  # the resolved max_tokens parameter
    num_cached_tokens: int  # prefix hits at its first admission, device and tiers
    tier_hits: tuple[tuple[str, int], ...]  # of which loaded from each tier below the device
    num_preemptions: int
    load_timed_out: bool = False  # a tier load or promotion failed; it recomputed instead
    lora_wait: float = 0.0  # seconds its passes waited for LoRA adapters to load
    pull_time: float = 0.0  # P/D decode side: seconds its KV took to pull
    # The request-level figures (vLLM's ParentRequest.observe_finished_request): the n of
    # the request and its longest output, on the last of n > 1 siblings to end; None on the
    # others (they are observed once per request, not per choice).
    n_param: int | None = 1
    max_generation_tokens: int = 0

    @classmethod
    def of(cls, request: Request) -> FinishedRequestStats:
        """Its record, made once, at its end (a child of n > 1 is counted out of its
        siblings here)."""
        end = request.finished_time
        generated = request.num_output_tokens
        n_param: int | None = 1
        parent = request.parent
        if parent is not None:
            last = parent.child_ended(generated)
            n_param = parent.n if last else None
            generated_max = parent.max_generation_tokens
        else:
            generated_max = generated
        return cls(
            request_id=request.request_id,
            finish_reason=request.finish_reason or FinishReason.ABORT,
            arrival_time=request.arrival_time,
            finished_time=request.arrival_time if end is None else end,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            num_prompt_tokens=request.num_prompt_tokens,
            num_generation_tokens=generated,
            max_tokens=request.max_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            tier_hits=request.tier_hits,
            num_preemptions=request.num_preemptions,
            load_timed_out=request.skip_tier_load,
            lora_wait=request.lora_wait,
            pull_time=request.pull_time,
            n_param=n_param,
            max_generation_tokens=generated_max,
        )

    @property
    def e2e_latency(self) -> float:
        return self.finished_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        first = self.first_token_time
        return None if first is None else first - self.arrival_time

    @property
    def queued_time(self) -> float | None:
        """WAITING until its first pass."""
        start = self.first_scheduled_time
        return None if start is None else start - self.arrival_time

    @property
    def inference_time(self) -> float | None:
        """From its first pass to its end."""
        start = self.first_scheduled_time
        return None if start is None else self.finished_time - start

    @property
    def prefill_time(self) -> float | None:
        start, first = self.first_scheduled_time, self.first_token_time
        return None if start is None or first is None else first - start

    @property
    def decode_time(self) -> float | None:
        first = self.first_token_time
        return None if first is None else self.finished_time - first

    @property
    def mean_time_per_output_token(self) -> float | None:
        """Decode time over the gaps between its tokens (None with fewer than two)."""
        decode = self.decode_time
        n = self.num_generation_tokens
        return None if decode is None or n < 2 else decode / (n - 1)

    @property
    def num_tier_cached_tokens(self) -> int:
        return sum(n for _, n in self.tier_hits)

    @property
    def num_device_cached_tokens(self) -> int:
        return self.num_cached_tokens - self.num_tier_cached_tokens
