"""The error a bad setting raises: its message names the setting (a leaf every layer imports)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A setting or a combination of settings that cannot work; the message names the setting."""
