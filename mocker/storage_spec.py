"""A secondary tier's specification (vLLM's tiering secondary_tiers): kind, size, links."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mocker.validation import fail, finite, int_in

__all__ = ["StorageKind", "StorageTierSpec"]


class StorageKind(StrEnum):
    """vLLM's secondary tier types (tiering): local files, or an object store shared by every
    engine of the process."""

    FS = "fs"
    OBJ = "obj"


@dataclass(frozen=True, slots=True)
class StorageTierSpec:
    """A secondary tier below the CPU tier. Bandwidths in GB/s (10^9 bytes/s, <= 0: instant),
    a fixed latency per transfer, and the chance that a copy to or from it fails."""

    kind: StorageKind
    capacity_blocks: int
    read_gbps: float
    write_gbps: float
    latency_ms: float = 0.0
    failure_rate: float = 0.0
    # Its blocks in the KV events (vLLM 0.34's per-tier enable_kv_events, which a config
    # leaves false unless it says otherwise).
    enable_kv_events: bool = True

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", StorageKind(self.kind))
        except ValueError:
            fail("type", self.kind, "must be one of fs, obj")
        int_in("capacity_blocks", self.capacity_blocks, 1, 1 << 40)
        for name in ("read_gbps", "write_gbps"):
            finite(name, getattr(self, name))
        finite("latency_ms", self.latency_ms, minimum=0.0)
        fr = self.failure_rate
        if isinstance(fr, bool) or not isinstance(fr, int | float) or not (0.0 <= fr <= 1.0):
            fail("failure_rate", fr, "must be in [0, 1]")

    @property
    def name(self) -> str:
        return self.kind.value
