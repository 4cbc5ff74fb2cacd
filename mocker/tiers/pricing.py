"""Whether loading blocks from the tiers pays off against recomputing them."""

from __future__ import annotations

from collections.abc import Callable

from mocker.config import EngineConfig
from mocker.tiers.link import Link

__all__ = ["LoadPricing"]


class LoadPricing:
    """Load rather than recompute, on the unscaled model times (the channels are scaled)."""

    def __init__(
        self, config: EngineConfig, block_bytes: int, prefill_ms: Callable[[int], float]
    ) -> None:
        self._min_blocks = config.offload.min_load_blocks
        self._always = config.offload.sync_loads  # LMCache loads every hit it finds
        self._unit = config.unit_blocks
        self._block_bytes = block_bytes
        self._block_size = config.block_size * config.unit_blocks
        self._h2d = Link(
            config.offload.cpu_read_gbps * 1e9, config.offload.transfer_latency_ms / 1000.0
        )
        self._prefill_ms = prefill_ms

    def pays_off(self, num_blocks: int, promote_s: float = 0.0) -> bool:
        """Enough blocks, and copying them (after a promotion of `promote_s`) is faster than
        prefilling their tokens (the transfers alone on their links)."""
        if num_blocks * self._unit < self._min_blocks:  # counted in device blocks
            return False
        if self._always:
            return True
        transfer_s = promote_s + self._h2d.duration(num_blocks * self._block_bytes)
        return transfer_s * 1000.0 < self._prefill_ms(num_blocks * self._block_size)
