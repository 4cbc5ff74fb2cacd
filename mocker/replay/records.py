"""What a replay records: a row per request, engine samples, and the result they make."""

from __future__ import annotations

from dataclasses import dataclass, field

from mocker.engine.core import EngineCore
from mocker.engine.stats import FinishedRequestStats
from mocker.tiers.transfers import TransferKind, TransferRecord

__all__ = ["EngineSample", "ReplayResult", "RequestRecord", "finished_record"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One row of requests.jsonl (times in seconds of simulated time)."""

    id: str
    line: int
    engine: int
    status: str  # "finished", or "rejected: <why>"
    arrival: float
    input_tokens: int
    output_tokens: int
    admit: float | None = None
    first_token: float | None = None
    finish: float | None = None
    ttft: float | None = None
    mean_itl: float | None = None
    e2e: float | None = None
    cached_tokens_device: int = 0
    # Of the prefix hits, the tokens loaded from each tier below the device (by name).
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    lora: str | None = None  # the adapter the trace row names
    lora_wait: float = 0.0  # seconds its passes waited for LoRA adapters to load
    # P/D (--prefill-engines): the engine that computed its prompt (`engine` decoded it),
    # and the seconds its KV took to pull from there.
    prefill_engine: int | None = None
    pull_time: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineSample:
    time: float
    engine: int
    kv_usage: float
    cpu_usage: float
    running: int
    waiting: int
    group_usage: tuple[float, ...] = ()  # hybrid models: per KV cache group


@dataclass(slots=True)
class ReplayResult:
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[EngineSample] = field(default_factory=list)
    cores: list[EngineCore] = field(default_factory=list)
    sim_duration: float = 0.0
    wall_s: float = 0.0
    num_steps: int = 0
    # Device ↔ CPU transfer bytes, from the transfer records (as the metrics count them),
    # and the bytes of every link, keyed "src->dst" (e.g. "cpu->fs").
    store_bytes: int = 0
    load_bytes: int = 0
    link_bytes: dict[str, int] = field(default_factory=dict)

    def count_transfers(self, records: list[TransferRecord]) -> None:
        for record in records:
            if not record.ok:
                continue  # (a failed promotion moved nothing)
            key = f"{record.src}->{record.dst}"
            self.link_bytes[key] = self.link_bytes.get(key, 0) + record.nbytes
            if not record.touches_device:
                continue
            if record.kind is TransferKind.STORE:
                self.store_bytes += record.nbytes
            else:
                self.load_bytes += record.nbytes


def finished_record(
    r: FinishedRequestStats,
    engine: int,
    line: int,
    lora: str | None = None,
    prefill_engine: int | None = None,
) -> RequestRecord:
    """The row of a request that finished."""
    return RequestRecord(
        id=r.request_id,
        line=line,
        engine=engine,
        status="finished",
        arrival=r.arrival_time,
        input_tokens=r.num_prompt_tokens,
        output_tokens=r.num_generation_tokens,
        admit=r.first_scheduled_time,
        first_token=r.first_token_time,
        finish=r.finished_time,
        ttft=r.time_to_first_token,
        mean_itl=r.mean_time_per_output_token,
        e2e=r.e2e_latency,
        cached_tokens_device=r.num_device_cached_tokens,
        cached_tokens_by_tier=dict(r.tier_hits),
        preemptions=r.num_preemptions,
        lora=lora,
        lora_wait=r.lora_wait,
        prefill_engine=prefill_engine,
        pull_time=r.pull_time,
    )
