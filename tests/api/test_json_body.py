"""json_body.loads: the stdlib's result or error for every body, orjson's speed where they agree."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import pytest

from mocker.api.json_body import loads

TRICKY = [
    b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 16, "stream": true}',
    b'{"logit_bias": {"5": 123456789012345678901234567890}}',  # past 64 bits: an int
    b"[18446744073709551616, -9223372036854775809]",
    b"9223372036854775807",  # 19 digits, in range
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',
    b"1e400",
    b'"\\ud800"',  # a lone surrogate
    b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 BOM
    '{"a": "é"}'.encode("utf-16"),  # another encoding (the stdlib detects it)
    b'{"a": "\xff"}',  # invalid UTF-8
    b'{"a": 1, "a": 2}',
    b'{"a": -0, "b": -0.0, "c": 1E5, "d": 0.1234567890123456789}',
    b"[" * 1100 + b"]" * 1100,  # deeper than orjson goes
    b'{"a": "\\u0000\\n\\t"}',
    b'{"a": "\x01"}',  # a raw control character
    b"",
    b"{",
    b'{"a": 1} x',
    b"  [1, 2.5, true, false, null]  ",
]


def _outcome(parse: Any, body: bytes) -> tuple[str, Any]:
    try:
        value = parse(body)
    except RecursionError:
        return ("error", "RecursionError")
    except ValueError as exc:  # (json.JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return ("error", (type(exc).__name__, str(exc)))
    return ("value", _canonical(value))


@dataclass(frozen=True)
class _Key:
    name: str


def _canonical(value: Any) -> list[tuple[str, Any]]:
    """Comparable across parsers: types kept (1 is not 1.0), NaN equal to itself, -0.0 apart;
    flat (a pre-order walk with each container's size), as Python 3.12+ parse nesting deeper
    than a recursive walk or comparison of it may go."""
    out: list[tuple[str, Any]] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Key):
            out.append(("key", item.name))
        elif isinstance(item, float):
            out.append(("float", "nan" if math.isnan(item) else repr(item)))
        elif isinstance(item, dict):
            out.append(("dict", len(item)))
            for key, member in reversed(list(item.items())):
                stack += [member, _Key(key)]
        elif isinstance(item, list):
            out.append(("list", len(item)))
            stack += reversed(item)
        else:
            out.append((type(item).__name__, item))
    return out


@pytest.mark.parametrize("body", TRICKY, ids=range(len(TRICKY)))
def test_the_stdlibs_result_or_error(body: bytes) -> None:
    assert _outcome(loads, body) == _outcome(json.loads, body)


def test_random_bodies_parse_alike() -> None:
    rng = random.Random(7)
    atoms: list[Any] = [0, -1, 2**63 - 1, -(2**63), 2**64, 10**30, 0.5, -2.5e-300, 1e300,
                        True, False, None, "", "a\"b\\c", "é\u2028", "\U0001f600"]  # fmt: skip

    def value(depth: int) -> Any:
        kind = rng.random()
        if depth > 3 or kind < 0.5:
            return rng.choice(atoms)
        if kind < 0.75:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{rng.randrange(5)}": value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(2000):
        body = json.dumps(value(0), ensure_ascii=rng.random() < 0.5).encode()
        assert _outcome(loads, body) == _outcome(json.loads, body), body


def test_orjson_parses_what_it_agrees_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """(The fast path is taken: a typical body never reaches the stdlib.)"""

    def refuse(body: bytes) -> Any:
        raise AssertionError("the stdlib was asked")

    monkeypatch.setattr("mocker.api.json_body.json.loads", refuse)
    assert loads(TRICKY[0]) == {"model": "m", "prompt": [1, 2, 3], "max_tokens": 16,
                                "stream": True}  # fmt: skip
