"""Small typed checks for tests."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def not_none(value: T | None) -> T:
    """`value`, asserted present (a field that is None only before its event happened)."""
    assert value is not None
    return value
