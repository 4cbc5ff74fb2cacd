"""A setting's value checked against what it allows, or a ConfigError naming both."""

from __future__ import annotations

import math
from typing import Any, NoReturn

from mocker.errors import ConfigError

__all__ = ["fail", "finite", "int_in"]


def fail(name: str, value: Any, allowed: str) -> NoReturn:
    """Refuse `name`=`value`, saying what it allows."""
    raise ConfigError(f"invalid {name}={value!r}: {allowed}")


def int_in(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    """An integer (not a bool) in [lo, hi]; no upper bound without hi."""
    if isinstance(value, bool) or not isinstance(value, int):
        fail(name, value, "must be an integer")
    if value < lo or (hi is not None and value > hi):
        fail(name, value, f"must be in [{lo}, {hi if hi is not None else '∞'})")


def finite(name: str, value: Any, minimum: float | None = None) -> None:
    """A finite int or float (not a bool), at least `minimum` if given."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        fail(name, value, "must be a finite number")
    if minimum is not None and value < minimum:
        fail(name, value, f"must be >= {minimum:g}")
