"""The LoRA adapters a server answers to as models: static (--lora-modules) and loaded at
runtime (POST /v1/load_lora_adapter), with vLLM's error messages."""

from __future__ import annotations

import os
from typing import Any

from mocker.api.errors import OpenAIError
from mocker.settings import ServerSettings
from mocker.settings.lora import LoraModule

__all__ = ["LoraAdapters", "runtime_updates_allowed"]

# A runtime adapter's name and path: longer is no name or path a client means.
_MAX_TEXT = 4096


def runtime_updates_allowed() -> bool:
    """vLLM's switch for the load/unload routes (unset: the routes do not exist)."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")


class LoraAdapters:
    """Adapter name → module, in load order; each request naming one runs with it."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._bases = set(settings.served_model_names) | {settings.model}
        self._modules: dict[str, LoraModule] = {}
        for module in settings.lora_modules:
            self._check_name(module.name)
            self._modules[module.name] = module

    def get(self, name: str | None) -> LoraModule | None:
        return None if name is None else self._modules.get(name)

    def __len__(self) -> int:
        return len(self._modules)

    def _check_name(self, name: str) -> None:
        if name in self._bases:
            raise OpenAIError(
                400, f"The lora adapter '{name}' conflicts with a served base model.",
                error_type="InvalidUserInput",
            )  # fmt: skip

    def load(self, name: str, path: str, *, in_place: bool = False) -> str:
        """Add an adapter (POST /v1/load_lora_adapter); the success text vLLM answers."""
        if not name or not path:
            raise OpenAIError(
                400, "Both 'lora_name' and 'lora_path' must be provided.",
                error_type="InvalidUserInput",
            )  # fmt: skip
        for field, value in (("lora_name", name), ("lora_path", path)):
            if len(value) > _MAX_TEXT or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
                # A name is a metric label and a model id; a path, a file name.
                raise OpenAIError(
                    400, f"'{field}' must be at most {_MAX_TEXT} characters of printable text.",
                    error_type="InvalidUserInput", param=field,
                )  # fmt: skip
        self._check_name(name)
        if name in self._modules and not in_place:
            raise OpenAIError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                error_type="InvalidUserInput",
            )
        self._modules[name] = LoraModule(name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: str) -> str:
        """Drop an adapter (POST /v1/unload_lora_adapter): requests stop resolving to it."""
        if not name:
            raise OpenAIError(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.",
                error_type="InvalidUserInput",
            )  # fmt: skip
        if self._modules.pop(name, None) is None:
            raise OpenAIError(
                404, f"The lora adapter '{name}' cannot be found.", error_type="NotFoundError"
            )
        return f"Success: LoRA adapter '{name}' removed successfully."

    def cards(self, created: int) -> list[dict[str, Any]]:
        """/v1/models entries, after the base models': parent is the base model named, if
        it is served, else the first served name (as vLLM)."""
        first = self._settings.served_model_names[0]
        return [
            {
                "id": m.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": m.path,
                "parent": m.base_model_name if m.base_model_name in self._bases else first,
                "max_model_len": None,
            }
            for m in self._modules.values()
        ]
