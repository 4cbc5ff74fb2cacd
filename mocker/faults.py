"""What faults to inject: failure types by name or status, a failure rate, latency jitter."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "FAULT_HEADER",
    "MAX_JITTER",
    "NO_FAULT",
    "FaultConfig",
    "FaultType",
    "parse_fault_type",
    "parse_fault_types",
]

# A request header that forces one fault (or, with NO_FAULT, none) on that request.
FAULT_HEADER = "X-Mocker-Fail"
NO_FAULT = "none"
# Jitter is a fraction of a latency; past 10× it is a hang, not jitter.
MAX_JITTER = 10.0


class FaultType(StrEnum):
    """The failures a request can be given, named as in the `type` label of the metric."""

    RATE_LIMIT = "rate_limit"  # 429
    OVERLOADED = "overloaded"  # 503
    SERVER_ERROR = "server_error"  # 500
    CONTEXT_LENGTH = "context_length"  # 400, vLLM's context-length message
    ABORT = "abort"  # starts normally, then the stream breaks off with an error event

    @property
    def status(self) -> int:
        """The HTTP status (for `abort`, the code in its error event: the response is 200)."""
        return _STATUS[self]


_STATUS = {
    FaultType.RATE_LIMIT: 429,
    FaultType.OVERLOADED: 503,
    FaultType.SERVER_ERROR: 500,
    FaultType.CONTEXT_LENGTH: 400,
    FaultType.ABORT: 500,
}
_BY_CODE = {str(status): t for t, status in _STATUS.items() if t is not FaultType.ABORT}


def parse_fault_type(text: str) -> FaultType:
    """One failure type by status code or name; raises ValueError listing the known ones."""
    key = text.strip().lower().replace("-", "_")
    fault = _BY_CODE.get(key)
    if fault is not None:
        return fault
    try:
        return FaultType(key)
    except ValueError:
        known = ", ".join([*_BY_CODE, *(t.value for t in FaultType)])
        raise ValueError(f"unknown failure type {text!r}; use one of {known}") from None


def parse_fault_types(items: Iterable[str | int]) -> tuple[FaultType, ...]:
    """Failure types by status code or name (`429`, `rate_limit`, `abort`, …), deduplicated
    in the order given; raises ValueError naming a bad one."""
    out: list[FaultType] = []
    for item in items:
        for part in str(item).replace(",", " ").split():
            fault = parse_fault_type(part)
            if fault not in out:
                out.append(fault)
    if not out:
        raise ValueError("give at least one failure type")
    return tuple(out)


def _fraction(name: str, value: Any, *, upper: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {value!r}")
    number = float(value)
    if not 0 <= number <= upper:  # NaN fails too
        raise ValueError(f"{name}={number!r} must be [0, {upper:g}]")
    return number


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """What to inject: a failure rate over some types, and jitter as fractions of latency."""

    failure_rate: float = 0.0
    failure_types: tuple[FaultType, ...] = tuple(FaultType)
    ttft_jitter: float = 0.0
    itl_jitter: float = 0.0

    def __post_init__(self) -> None:
        for name, upper in (("failure_rate", 1.0), ("ttft_jitter", MAX_JITTER),
                            ("itl_jitter", MAX_JITTER)):  # fmt: skip
            object.__setattr__(self, name, _fraction(name, getattr(self, name), upper=upper))
        if not self.failure_types:
            raise ValueError("failure_types must name at least one failure type")

    def with_changes(self, changes: Mapping[str, Any]) -> FaultConfig:
        """A copy with `changes` (JSON values: failure_types as a list or a comma string);
        raises ValueError on an unknown key or a bad value, changing nothing."""
        fields = set(self.as_json())
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ValueError(
                f"unknown setting(s) {', '.join(unknown)}; runtime settings are "
                + ", ".join(sorted(fields))
            )
        values = dict(changes)
        if "failure_types" in values:
            types = values["failure_types"]
            if isinstance(types, str | int) and not isinstance(types, bool):
                types = [types]
            if not isinstance(types, list) or any(isinstance(t, bool | dict | list) for t in types):
                raise ValueError("failure_types must be a list of names or status codes")
            values["failure_types"] = parse_fault_types(types)
        return replace(self, **values)  # __post_init__ checks the numbers

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["failure_types"] = [t.value for t in self.failure_types]
        return out

    @property
    def has_jitter(self) -> bool:
        return self.ttft_jitter > 0 or self.itl_jitter > 0
