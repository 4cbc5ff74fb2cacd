"""Promotions: a request's continuation copied from a secondary tier to the CPU tier, to be
loaded from there by the request's next lookup (vLLM 0.34's tiering: a lookup that finds
the blocks below the CPU tier answers "retry later" while they come up)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.context import TierContext
from mocker.tiers.link import TransferId
from mocker.tiers.loads import NO_TRANSFER
from mocker.tiers.pricing import LoadPricing
from mocker.tiers.storage import StorageTier
from mocker.tiers.tier import BlockKey
from mocker.tiers.transfers import TransferKind

__all__ = ["Promotion", "Promotions"]


@dataclass(slots=True, eq=False)
class Promotion:
    """A secondary tier → CPU copy for a request (the first hop of a staged load): the
    tier's blocks are pinned, the CPU slots reserved, and the request's CPU run pinned
    (its hold) so that nothing it will load is evicted meanwhile."""

    request: Request
    tier: StorageTier
    tid: TransferId
    keys: list[BlockKey]
    hold: Sequence[BlockKey]
    start: float
    deadline: float
    live: bool = True  # until it ends, fails or is cancelled


class Promotions:
    """The connector's promotions in flight, the runs they pin in the CPU tier, and the
    runs kept for the requests' retries."""

    def __init__(self, connector: TierContext, pricing: LoadPricing) -> None:
        self._c = connector
        self._pricing = pricing
        self.active: dict[Request, Promotion] = {}
        self.promoting: dict[BlockKey, Promotion] = {}  # keys on their way to the CPU tier
        # Promoted runs kept for a retry (each pinned as itself: a pin is released with the
        # sequence that took it), and holds to unpin after this pass's loads.
        self.holds: dict[Request, list[Sequence[BlockKey]]] = {}
        self.released: list[Sequence[BlockKey]] = []
        # CPU runs found this pass, to spare: (keys, start, stop), cut only if a promotion
        # must pin them (most passes start none).
        self.looked_up: list[tuple[Sequence[BlockKey], int, int]] = []

    def release_hold(self, request: Request) -> None:
        """What was kept for the request's retry is unpinned after this pass's loads."""
        hold = self.holds.pop(request, None)
        if hold is not None:
            self.released += hold

    def end_schedule(self) -> None:
        """The pass's loads have pinned their CPU blocks: the holds they replace go."""
        self.looked_up = []
        released, self.released = self.released, []
        for hold in released:
            self._c.cpu.complete_load(hold)

    def find(self, hashes: Sequence[BlockHash], pos: int, stop: int) -> tuple[int, int] | None:
        """(tier index, run) of the first secondary tier holding the continuation at `pos`."""
        for i, tier in enumerate(self._c.storage):
            m = tier.tier.lookup(hashes, pos, stop)
            if m:
                return i, m
        return None

    def start(
        self, request: Request, hashes: Sequence[BlockHash], dev: int, pos: int, index: int,
        m: int,
    ) -> bool:  # fmt: skip
        """Start promoting the request's continuation (`m` blocks at `pos`) from the
        secondary tier `index`, if loading all of it then pays off. True: started (retry
        later)."""
        c = self._c
        tier = c.storage[index]
        promote_s = tier.read_model.duration(m * c.block_bytes)
        if not self._pricing.pays_off(pos - dev + m, promote_s):
            return False
        cpu = c.cpu
        copies = tier.tier.copies(hashes[pos : pos + m])
        # The request's CPU run is pinned first: making room must not evict it.
        hold = hashes[dev:pos]
        cpu.prepare_load(hold)
        # Neither may the runs other requests found this pass, which they are about to load.
        looked_up = [keys[lo:hi] for keys, lo, hi in self.looked_up]
        for run in looked_up:
            cpu.pin(run)
        plan = cpu.prepare_store(copies)
        for run in looked_up:
            cpu.unpin(run)
        if plan.evicted:
            c.policy.cpu_evicted(plan.evicted)
        keys = plan.keys
        if not keys:
            cpu.complete_load(hold)
            return False
        c.policy.cpu_gained(keys)  # (undone by `_unwind` if the promotion fails)
        tier.tier.prepare_load(keys)
        now = c.time
        promotion = Promotion(request, tier, NO_TRANSFER, keys, hold, now, now + c.load_timeout)
        promotion.tid = tier.read.start(now, len(keys) * c.block_bytes,
                                        partial(self._ended, promotion))  # fmt: skip
        self.active[request] = promotion
        for key in keys:
            self.promoting[key] = promotion
        c.push_timeout(promotion.deadline, promotion)
        c.version += 1
        return True

    def _ended(self, promotion: Promotion, end: float) -> None:
        c = self._c
        tier = promotion.tier
        if tier.fails():
            c.counters[tier.name].promotion_failures += 1
            self.failed(promotion, end)
            return
        self._end(promotion)  # bumps the version
        tier.tier.complete_load(promotion.keys)
        c.cpu.complete_store(promotion.keys)
        # The landed blocks join the hold: pinned until the request's retry.
        c.cpu.prepare_load(promotion.keys)
        self.holds[promotion.request] = [promotion.hold, promotion.keys]
        request = promotion.request
        if request.promoted is None:
            request.promoted = {}
        request.promoted.update(dict.fromkeys(promotion.keys, tier.name))
        n = len(promotion.keys)
        c.record(TransferKind.LOAD, tier.name, c.cpu.name, n, promotion.start, end)

    def failed(self, promotion: Promotion, end: float) -> None:
        """A promotion failed (or timed out) at `end`: recorded (its latency, no bytes), then
        unwound."""
        c = self._c
        c.record(TransferKind.LOAD, promotion.tier.name, c.cpu.name, 0, promotion.start, end,
                 ok=False)  # fmt: skip
        self._unwind(promotion)

    def _end(self, promotion: Promotion) -> None:
        del self.active[promotion.request]
        promotion.live = False
        for key in promotion.keys:
            del self.promoting[key]
        self._c.version += 1

    def _unwind(self, promotion: Promotion) -> None:
        """A promotion failed or timed out: free both hops' reservations; the request
        recomputes (its next lookup answers 0)."""
        c = self._c
        self._end(promotion)
        promotion.tier.tier.complete_load(promotion.keys)
        c.cpu.complete_store(promotion.keys, success=False)
        # While the keys were incoming the CPU tier "held" them, so a request that computed
        # one of them meanwhile left its device block unretained (write-back): the policy
        # must hear they are gone, or that block is later evicted without being copied.
        c.policy.cpu_evicted(promotion.keys)
        c.cpu.complete_load(promotion.hold)
        promotion.request.skip_tier_load = True

    def drop(self, now: float, request: Request) -> None:
        """The request ended (abort, finish) outside a load: its promotion is cancelled and
        its hold released."""
        promotion = self.active.get(request)
        if promotion is not None:
            promotion.tier.read.cancel(now, promotion.tid)
            self._unwind(promotion)
        for run in self.holds.pop(request, ()):
            self._c.cpu.complete_load(run)
