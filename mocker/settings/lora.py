"""`--lora-modules`: vLLM's two spellings of a LoRA adapter, `name=path` and a JSON object."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from mocker.config import ConfigError

__all__ = ["LoraModule", "parse_lora_modules"]


@dataclass(frozen=True, slots=True)
class LoraModule:
    """An adapter the server answers to as a model: its name, path and base model."""

    name: str
    path: str
    base_model_name: str | None = None


def _parse_one(item: str) -> LoraModule:
    # vLLM's rule: `=` and no `,` is name=path (split at the first `=`), anything else JSON.
    if "=" in item and "," not in item:
        name, _, path = item.partition("=")
        if not name or not path:
            raise ConfigError(f"invalid --lora-modules {item!r}: write name=path")
        return LoraModule(name, path)
    try:
        obj = json.loads(item)
    except json.JSONDecodeError:
        raise ConfigError(f"Invalid JSON format for --lora-modules: {item}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"Invalid fields for --lora-modules: {item} - not an object")
    unknown = set(obj) - {"name", "path", "base_model_name", "is_3d_lora_weight"}
    jname, jpath, base = obj.get("name"), obj.get("path"), obj.get("base_model_name")
    if (
        unknown
        or not isinstance(jname, str)
        or not isinstance(jpath, str)
        or not jname
        or not jpath
    ):
        raise ConfigError(
            f"Invalid fields for --lora-modules: {item} - needs string 'name' and 'path' "
            "(and optionally 'base_model_name')"
        )
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"Invalid fields for --lora-modules: {item} - base_model_name")
    return LoraModule(jname, jpath, base)


def parse_lora_modules(items: Sequence[str] | None) -> tuple[LoraModule, ...]:
    """The adapters, in the order given; a name twice is refused."""
    modules = tuple(_parse_one(item) for item in items or ())
    names = [m.name for m in modules]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"--lora-modules: the adapter {name!r} is given twice")
    return modules
