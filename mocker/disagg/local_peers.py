"""Prefill engines in the same process (replay, tests): a decode engine's notifications are
direct calls on the prefill engine's holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from mocker.disagg.params import RemotePrefill
from mocker.disagg.pulls import Pull

if TYPE_CHECKING:
    from mocker.engine.core import EngineCore

__all__ = ["LocalPeers"]


class LocalPeers:
    """The prefill engines a decode engine can pull from, by their kv engine id."""

    def __init__(self, engines: Mapping[str, EngineCore]) -> None:
        self.engines = engines

    def read_done(self, pull: Pull) -> bool | None:
        """Free the prefill engine's hold; whether it still held the blocks (its engine id
        names a live engine, and the hold did not expire)."""
        return self._release(pull.remote)

    def release(self, remote: RemotePrefill) -> None:
        self._release(remote)

    def _release(self, remote: RemotePrefill) -> bool:
        engine = self.engines.get(remote.engine_id)
        if engine is None or engine.holds is None:
            return False
        return engine.release_hold(remote.request_id)
