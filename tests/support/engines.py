"""Small engine configs, cores and request builders for tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.outputs import RequestOutput
from mocker.request import EngineRequest, FinishReason, Request, RequestId, SamplingParams
from mocker.timing import PassShape


def small_config(**overrides: Any) -> EngineConfig:
    base: dict[str, Any] = {
        "block_size": 4,
        "num_gpu_blocks": 64,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 32,
        "max_model_len": 256,
    }
    base.update(overrides)
    return EngineConfig.of(**base)


def make_core(**overrides: Any) -> EngineCore:
    return EngineCore(small_config(**overrides))


def req(
    rid: str,
    prompt: Sequence[int],
    max_tokens: int | None = 4,
    arrival: float = 0.0,
    **sampling: Any,
) -> EngineRequest:
    return EngineRequest(
        rid, list(prompt), SamplingParams(max_tokens=max_tokens, **sampling), arrival_time=arrival
    )


def core_request(
    rid: str,
    prompt: Sequence[int],
    max_tokens: int = 1,
    sampling: SamplingParams | None = None,
    arrival: float = 0.0,
    **fields: Any,
) -> Request:
    """The engine's own Request for `prompt`, built without a core (sampling: max_tokens)."""
    if sampling is None:
        sampling = SamplingParams(max_tokens=max_tokens)
    tokens = list(prompt)
    return Request(RequestId(rid), tokens, len(tokens), max_tokens, sampling, arrival, **fields)


def output(rid: str, ids: list[int], end: bool = False) -> RequestOutput:
    """A pass's output of `ids` for `rid` at time 1.0; `end`: its last (by length)."""
    return RequestOutput(rid, ids, 1.0, end, FinishReason.LENGTH if end else None, 3)


def prefill_ms(t: int) -> float:
    """Dynamo's polynomial prefill time of `t` new tokens (0 for none), by hand."""
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142 if t else 0.0


class CompositionTiming:
    """A timing model that reads every count of a pass's composition (as the GPU model does),
    each with its own weight: a pass timed from a wrong count takes another time."""

    reads_context = True

    def __init__(self) -> None:
        self.shapes: list[PassShape] = []

    def pass_ms(self, shape: PassShape) -> float:
        self.shapes.append(shape)
        if not (shape.prefill_tokens or shape.num_decodes):
            return 0.0
        return (1.0 + 0.01 * shape.prefill_tokens + 0.3 * shape.prefill_requests
                + 1e-4 * shape.prefill_context + 0.05 * shape.num_decodes
                + 1e-5 * shape.decode_context)  # fmt: skip

    def prefill_ms(self, new_tokens: int) -> float:
        return 1.0 + 0.01 * new_tokens + 0.3 if new_tokens > 0 else 0.0


class SpanTiming(CompositionTiming):
    """CompositionTiming whose decode passes read their mean context in steps of 8 tokens and
    say how long a step lasts (`decode_span`, as the GPU model's memo does)."""

    def pass_ms(self, shape: PassShape) -> float:
        if shape.num_decodes and not shape.prefill_tokens:
            return self.decode_span(shape.num_decodes, shape.decode_context)[0]
        return super().pass_ms(shape)

    def decode_span(self, n: int, context: int) -> tuple[float, int]:
        mean = context // n
        return 1.0 + 0.05 * n + 1e-3 * (mean // 8), 8 - mean % 8
