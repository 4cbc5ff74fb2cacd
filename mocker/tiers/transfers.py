"""Records of finished transfers between tiers, and per-tier counters, for metrics and
reports."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

__all__ = ["DEVICE", "TierCounters", "TransferKind", "TransferRecord"]

DEVICE = "gpu"  # the device's name in channel keys and transfer records


class TransferKind(IntEnum):
    STORE = 0  # towards slower storage (device → CPU, CPU → a secondary tier)
    LOAD = 1  # towards the device (CPU → device, a secondary tier → CPU)


class TransferRecord(NamedTuple):
    """A finished transfer (times on the engine's clock) from tier `src` to tier `dst`
    (tier names: "gpu", "cpu", "fs", "obj"). A named tuple: one is made per transfer, and a
    frozen dataclass costs several times as much to build."""

    kind: TransferKind
    num_blocks: int
    nbytes: int
    start: float
    end: float
    src: str = "gpu"
    dst: str = "cpu"
    ok: bool = True  # False: a promotion that failed or timed out (no bytes counted)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def touches_device(self) -> bool:
        """A device ↔ CPU copy (vLLM's flat kv_offload_* metrics count only these)."""
        return self.src == "gpu" or self.dst == "gpu"

    @property
    def tier(self) -> str:
        """The tier below the device end: the destination of a store, the source of a load."""
        return self.dst if self.kind is TransferKind.STORE else self.src


@dataclass(slots=True)
class TierCounters:
    """One engine's cumulative use of one secondary tier (vLLM's tiering counters)."""

    block_queries: int = 0
    block_hits: int = 0
    promotion_failures: int = 0
    cascade_failures: int = 0
