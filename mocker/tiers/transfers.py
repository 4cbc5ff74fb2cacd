"""Records of finished transfers between tiers, for metrics and reports."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["TransferKind", "TransferRecord"]


class TransferKind(IntEnum):
    STORE = 0
    LOAD = 1


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """A finished transfer (times on the engine's clock)."""

    kind: TransferKind
    num_blocks: int
    nbytes: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start
