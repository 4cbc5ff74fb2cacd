"""`--model-shape`: a preset, or a custom shape given inline or in a JSON / YAML file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mocker.errors import ConfigError
from mocker.model_shape import MODEL_PRESETS, ModelShape

__all__ = ["model_shape_from"]


def model_shape_from(value: str | Mapping[str, Any]) -> ModelShape:
    """A preset by name, or a custom shape: a JSON object (inline, or a YAML mapping), or
    the path of a .json / .yaml file holding one."""
    if isinstance(value, Mapping):
        return ModelShape.from_mapping(value)
    text = value.strip()
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid model_shape: not valid JSON: {exc}") from None
        return ModelShape.from_mapping(raw)
    path = Path(text)
    if path.suffix in (".json", ".yaml", ".yml"):
        try:
            raw = yaml.safe_load(path.read_text())  # JSON is YAML
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"invalid model_shape={text!r}: cannot read: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"invalid model_shape={text!r}: not JSON or YAML: {exc}") from None
        return ModelShape.from_mapping(raw)
    raise ConfigError(
        f"invalid model_shape={text!r}: one of the presets {', '.join(MODEL_PRESETS)}, a JSON "
        "object, or a .json / .yaml file"
    )
