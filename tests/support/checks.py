"""Small typed checks for tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from mocker.engine.outputs import RequestOutput
from mocker.engine.stream import StreamError

T = TypeVar("T")


def not_none(value: T | None) -> T:
    """`value`, asserted present (a field that is None only before its event happened)."""
    assert value is not None
    return value


def only_outputs(seen: Iterable[RequestOutput | StreamError]) -> list[RequestOutput]:
    """What a stream's listener was handed, asserted to hold outputs only (no failure)."""
    outputs: list[RequestOutput] = []
    for out in seen:
        assert isinstance(out, RequestOutput), out
        outputs.append(out)
    return outputs
