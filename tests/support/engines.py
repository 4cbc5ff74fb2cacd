"""Small engine configs, cores and request builders for tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.request import EngineRequest, SamplingParams


def small_config(**overrides: Any) -> EngineConfig:
    base: dict[str, Any] = {
        "block_size": 4,
        "num_gpu_blocks": 64,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 32,
        "max_model_len": 256,
    }
    base.update(overrides)
    return EngineConfig(**base)


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
