"""One setting: its flag, env var and YAML key, type, default and help, and text parsing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ENV_PREFIX", "Kind", "Option", "parse_float", "parse_int"]

ENV_PREFIX = "MOCKER_"

# str | int | float | bool (--x / --no-x) | flag (--x only) | names (a list) | json (text
# parsed by whoever owns the setting, so its errors can name its keys).
Kind = Literal["str", "int", "float", "bool", "flag", "names", "json"]


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("must be an integer") from None


def parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be finite")
    return value


def _names(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": parse_int,
    "float": parse_float,
    "bool": _bool,
    "flag": _bool,
    "names": _names,
    "json": str,
}


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its flag, its type, default and help, and its env / YAML spellings."""

    dest: str
    help: str
    default: Any = None
    kind: Kind = "str"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()

    def parse_text(self, text: str) -> Any:
        """Convert an env var / YAML scalar given as text."""
        value = _CONVERTERS[self.kind](text)
        self._check_choice(value)
        return value

    def parse_yaml(self, value: Any) -> Any:
        if value is None:
            if self.default is not None:
                raise ValueError("must not be null")
            return None
        if isinstance(value, str):
            return self.parse_text(value)
        if self.kind == "json" and isinstance(value, dict):
            return value
        if self.kind == "names" and isinstance(value, list):
            # An object in a list (a --lora-modules entry) keeps its JSON spelling.
            return [json.dumps(v) if isinstance(v, dict) else str(v) for v in value]
        if self.kind in ("bool", "flag") and isinstance(value, bool):
            return value
        if self.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        return self.parse_text(str(value))

    def _check_choice(self, value: Any) -> None:
        if self.choices is not None and value not in self.choices:
            raise ValueError("must be one of " + ", ".join(self.choices))
