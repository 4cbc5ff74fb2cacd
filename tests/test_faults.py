"""Fault configuration: failure types by code or name, runtime changes checked whole."""

from __future__ import annotations

from typing import Any

import pytest

from mocker.faults import FaultConfig, FaultType, parse_fault_types


def test_failure_types_by_code_or_name() -> None:
    assert parse_fault_types(["429", "rate_limit", "503,abort", "Server-Error", 400]) == (
        FaultType.RATE_LIMIT,
        FaultType.OVERLOADED,
        FaultType.ABORT,
        FaultType.SERVER_ERROR,
        FaultType.CONTEXT_LENGTH,
    )
    with pytest.raises(ValueError, match="unknown failure type '404'"):
        parse_fault_types(["404"])
    with pytest.raises(ValueError, match="at least one"):
        parse_fault_types([" , "])


def test_runtime_changes_are_checked_whole() -> None:
    config = FaultConfig(failure_rate=0.1)
    changed = config.with_changes({"failure_rate": 1, "failure_types": "503, abort"})
    assert changed.failure_rate == 1.0
    assert changed.failure_types == (FaultType.OVERLOADED, FaultType.ABORT)
    assert changed.as_json() == {
        "failure_rate": 1.0,
        "failure_types": ["overloaded", "abort"],
        "ttft_jitter": 0.0,
        "itl_jitter": 0.0,
    }
    bad_changes: list[tuple[dict[str, Any], str]] = [
        ({"failure_rate": 2}, r"must be \[0, 1\]"),
        ({"failure_rate": True}, "must be a number"),
        ({"itl_jitter": -0.5}, "itl_jitter"),
        ({"failure_types": []}, "at least one"),
        ({"failure_types": [{"x": 1}]}, "list of names"),
        ({"speed": 2}, "unknown setting"),
    ]
    for bad, message in bad_changes:
        with pytest.raises(ValueError, match=message):
            config.with_changes(bad)
    assert config.failure_rate == 0.1  # frozen: a failed change changes nothing
