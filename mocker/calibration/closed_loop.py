"""A measurement's workload replayed as `mocker replay --concurrency C` runs it: the mean TTFT and
TPOT the engine predicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mocker.calibration.measurements import Measurement
from mocker.config import EngineConfig
from mocker.errors import ConfigError
from mocker.replay.runner import replay
from mocker.replay.trace import TraceRequest
from mocker.settings import ENGINE_OPTIONS, engine_config_from
from mocker.settings.deployment import HARDWARE_OPTIONS
from mocker.timing import TimingModel

__all__ = ["Prediction", "engine_config_for", "predict"]

# Each request's prompt blocks are its own (random prompts share no prefix).
_TRACE_BLOCK = 512
_UNIQUE_BASE = 1 << 41


@dataclass(frozen=True, slots=True)
class Prediction:
    """The engine's means for a measurement's workload (ms), and what ran."""

    ttft_ms: float
    tpot_ms: float
    requests: int
    preemptions: int


def engine_config_for(m: Measurement, **changes: Any) -> EngineConfig:
    """The engine a measurement ran on, built from the options as `mocker replay` builds it
    (`changes`: other option values, e.g. timing_model="polynomial")."""
    values = {o.dest: o.default for o in ENGINE_OPTIONS}
    values.update(
        model=m.model,
        gpu=m.gpu,
        tensor_parallel_size=m.tensor_parallel_size,
        pipeline_parallel_size=m.pipeline_parallel_size,
        quantization=m.quantization,
        kv_cache_dtype=m.kv_cache_dtype,
        gpu_memory_utilization=m.gpu_memory_utilization,
        max_num_seqs=m.max_num_seqs,
        max_num_batched_tokens=m.max_num_batched_tokens,
        block_size=m.block_size,
    )
    values.update(changes)
    if values["timing_model"] == "polynomial":
        # Dynamo's model knows no deployment: the measurement's stays out (unwarned).
        values.update({o.dest: o.default for o in HARDWARE_OPTIONS})
    return engine_config_from(values)


def predict(
    m: Measurement, config: EngineConfig | None = None, timing: TimingModel | None = None
) -> Prediction:
    """Replay the measurement's closed loop: C users, each sending its next request when
    its last one ends, every output to its length (ignore_eos)."""
    config = engine_config_for(m) if config is None else config
    trace = []
    next_id = _UNIQUE_BASE
    longest = config.scheduler.max_model_len
    for prompt, output in m.workload():
        prompt = min(prompt, longest - 1)
        output = min(output, longest - prompt)
        blocks = -(-prompt // _TRACE_BLOCK)
        trace.append(TraceRequest(0.0, prompt, output, tuple(range(next_id, next_id + blocks)), 0))
        next_id += blocks
    result = replay(trace, config, concurrency=m.concurrency, trace_block_size=_TRACE_BLOCK,
                    num_samples=1, timing=timing)  # fmt: skip
    done = [r for r in result.records if r.status == "finished" and r.ttft is not None]
    if not done:
        raise ConfigError(f"{m.label}: no request of the workload finished (all refused?)")
    ttft = sum(r.ttft for r in done if r.ttft is not None) / len(done)
    tpots = [r.mean_itl for r in done if r.mean_itl is not None]
    tpot = sum(tpots) / len(tpots) if tpots else 0.0
    return Prediction(ttft * 1000.0, tpot * 1000.0, len(done), sum(r.preemptions for r in done))
