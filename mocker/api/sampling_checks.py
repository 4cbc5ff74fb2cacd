"""vLLM's range checks of sampling values (its `SamplingParams._verify_args`): 400s naming them."""

from __future__ import annotations

import math
from typing import NoReturn, Protocol

from mocker.api.errors import OpenAIError

__all__ = ["check_sampling", "check_token_params"]


class _Knobs(Protocol):
    """The sampling fields of a completion, chat or generate body (mocker.api.body_fields)."""

    presence_penalty: float | None
    frequency_penalty: float | None
    repetition_penalty: float | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    stop: str | list[str] | None
    stream_interval: int | None
    logit_bias: dict[str, float] | None
    allowed_token_ids: list[int] | None


def check_sampling(body: _Knobs) -> None:
    """Refuse what vLLM's SamplingParams refuses, with its messages and in its order (None is
    its default, always valid). The mock samples none of these: a client still hears the
    400 a real server would give it, rather than a stream."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value is not None and not -2.0 <= value <= 2.0:
            _refuse(name, f"must be in [-2, 2], got {value}.")
    value = body.repetition_penalty
    if value is not None:
        if not math.isfinite(value):
            _refuse("repetition_penalty", f"must be a finite number, got {value}.")
        if value <= 0.0:
            _refuse("repetition_penalty", f"must be greater than zero, got {value}.")
    value = body.temperature
    if value is not None:
        if not math.isfinite(value):
            _refuse("temperature", f"must be a finite number, got {value}.")
        if value < 0.0:
            _refuse("temperature", f"must be non-negative, got {value}.")
        if value > 2.0:
            _refuse("temperature", f"must be in [0, 2], got {value}.")
    value = body.top_p
    if value is not None and not 0.0 < value <= 1.0:
        _refuse("top_p", f"must be in (0, 1], got {value}.")
    if body.top_k is not None and body.top_k < -1:  # (-1: disabled, as 0)
        _refuse("top_k", f"must be 0 (disable), or at least 1, got {body.top_k}.")
    value = body.min_p
    if value is not None and not 0.0 <= value <= 1.0:
        _refuse("min_p", f"must be in [0, 1], got {value}.")
    if body.stream_interval is not None and body.stream_interval < 1:
        _refuse("stream_interval", f"must be at least 1, got {body.stream_interval}.")
    stop = body.stop
    if stop is not None and "" in ([stop] if isinstance(stop, str) else stop):
        raise OpenAIError(400, "stop cannot contain an empty string.", "stop")


def check_token_params(body: _Knobs, vocab_size: int) -> None:
    """vLLM's checks of the token ids a request names for sampling (its SamplingParams and
    input processor): logit_bias keys that are integers in the vocabulary, allowed_token_ids
    not empty and in it."""
    bias = body.logit_bias
    if bias:
        ids: list[int] = []
        bad: list[str] = []
        for key in bias:
            try:
                ids.append(int(key))
            except ValueError:
                bad.append(key)
        if bad:
            raise OpenAIError(400, "logit_bias contains key(s) that cannot be converted to "
                              f"integer token IDs: {bad!r}", "logit_bias")  # fmt: skip
        outside = [t for t in ids if not 0 <= t < vocab_size]
        if outside:
            message = (
                f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. "
                f"Vocabulary size: {vocab_size}"
            )
            raise OpenAIError(400, message, "logit_bias")
    allowed = body.allowed_token_ids
    if allowed is not None:
        if not allowed:
            _refuse("allowed_token_ids", "is not None and empty!")
        if not all(0 <= t < vocab_size for t in allowed):
            _refuse("allowed_token_ids", "contains out-of-vocab token id!")


def _refuse(name: str, rule: str) -> NoReturn:
    raise OpenAIError(400, f"{name} {rule}", name)
