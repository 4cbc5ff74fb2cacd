"""A user's JSON file read as an object, or a ConfigError naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mocker.errors import ConfigError

__all__ = ["read_json_object"]


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """The object the file holds; `what` names it in the error (a flag, or the file)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{what}: cannot read it: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{what}: must hold a JSON object")
    return raw
