"""Lookups: how many more blocks the tiers below the device hold for a request (vLLM's
get_num_new_matched_tokens), and vLLM 0.34's tiering lookup counters."""

from __future__ import annotations

from collections.abc import Sequence

from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.context import TierContext
from mocker.tiers.hybrid_store import chunk_keys
from mocker.tiers.pricing import LoadPricing
from mocker.tiers.promotions import Promotions
from mocker.tiers.sync_loads import SyncLoads

__all__ = ["Lookups"]


class Lookups:
    """The connector's answers to the scheduler's lookups."""

    def __init__(
        self,
        connector: TierContext,
        promotions: Promotions,
        pricing: LoadPricing,
        sync: SyncLoads | None = None,
    ) -> None:
        self._c = connector
        self._promotions = promotions
        self._pricing = pricing
        self._sync = sync
        self._pays_off: dict[int, bool] = {}  # pricing.pays_off(n) of a CPU-tier hit of n

    def num_matched_blocks(self, request: Request, num_device_blocks: int) -> int | None:
        """Blocks to load after a device hit of `num_device_blocks` (vLLM's
        get_num_new_matched_tokens, in blocks): the contiguous continuation the CPU tier
        holds, if loading it pays off (else 0: recompute); None ("retry later") while the
        continuation is being promoted from a secondary tier. The lookup stops one token
        short of the prompt, as the device's does."""
        c = self._c
        if request in self._promotions.active:
            return None
        if request in self._promotions.holds:
            self._promotions.release_hold(request)  # unpinned once this pass's loads pinned theirs
        if request.skip_tier_load:
            request.promoted = None
            return 0
        hashes = chunk_keys(request.block_hashes, c.unit)
        sync = self._sync
        if c.lmcache is not None and sync is not None and sync.looks_up(request):
            sync.looked_up(request, self._lmcache_hit(request, hashes))
        stop = min((len(request.all_token_ids) - 1) // c.block_size, len(hashes))
        # With chunks, the tiers hold whole chunks of the prompt's full blocks (vLLM's offload
        # keys, LMCache's lookups): a hit is of whole chunks, then cut one token short.
        limit = stop
        if c.chunk > 1:
            limit = min(len(request.all_token_ids) // c.block_size, len(hashes))
            limit -= limit % c.chunk
        n = c.cpu.lookup(hashes, num_device_blocks, limit) if limit > num_device_blocks else 0
        pos = num_device_blocks + n
        if c.chunk > 1:
            pos = min(max(pos - pos % c.chunk, num_device_blocks), stop)
            n = pos - num_device_blocks
        if c.storage and pos < stop:
            promotions = self._promotions
            if hashes[pos] in promotions.promoting:
                return None  # another request's promotion brings it: wait for that
            found = promotions.find(hashes, pos, limit)
            if found is not None and c.chunk > 1:
                end = pos + found[1]
                end = min(end - end % c.chunk, stop)
                found = (found[0], end - pos) if end > pos else None
            self._count_lookups(request, n, stop - pos, found)
            if found is not None and promotions.start(request, hashes, num_device_blocks, pos,
                                                      *found):  # fmt: skip
                return None
        elif c.storage and stop > num_device_blocks:
            self._count_lookups(request, n, 0, None)
        pays = self._pays_off.get(n)
        if pays is None:  # (a pure function of n: kept)
            pays = self._pays_off[n] = bool(n) and self._pricing.pays_off(n)
        if not pays:
            request.promoted = None  # what was promoted for it is not loaded (now)
            return 0
        if c.storage:
            # Another request's promotion in this same pass may make room in the CPU tier:
            # the run is spared until this pass's loads have pinned theirs (a promotion pins
            # these runs while it reserves; nothing else evicts from the CPU tier in a pass).
            self._promotions.looked_up.append((hashes, num_device_blocks, pos))
        return n

    def _lmcache_hit(self, request: Request, hashes: Sequence[BlockHash]) -> int:
        """LMCache's own lookup: the whole chunks it holds from the first token on, in its
        CPU tier, then on its disk or remote store (tokens)."""
        c = self._c
        chunk = c.chunk
        stop = min(len(request.all_token_ids) // c.block_size // chunk * chunk, len(hashes))
        pos = c.cpu.lookup(hashes, 0, stop)
        for tier in c.storage:
            if pos >= stop:
                break
            pos += tier.tier.lookup(hashes, pos, stop)
        return (pos - pos % chunk) * c.block_size

    def skip(self, request: Request) -> None:
        """The request is admitted without a lookup (or without loading what one found):
        what the connector kept for its retry is released, as a lookup would."""
        self._promotions.release_hold(request)
        request.promoted = None

    def _count_lookups(
        self, request: Request, n: int, rest: int, found: tuple[int, int] | None
    ) -> None:
        """The tiering lookup counters, as vLLM 0.34 counts them: chunk by chunk from the
        device hit until one no tier holds, each chunk once per request (its first lookup),
        in the CPU tier first, then in the secondary tiers in order until one holds it.
        `n` chunks were in the CPU tier, `rest` follow; `found`: the tier promoting a run."""
        c = self._c
        if request.lookups_counted:
            return
        request.lookups_counted = True
        j, m = found if found is not None else (len(c.storage), 0)
        missed = 1 if m < rest else 0  # the chunk that ends the walk
        c.primary.block_queries += n + m + missed
        c.primary.block_hits += n
        for i, tier in enumerate(c.storage):
            counters = c.counters[tier.name]
            counters.block_queries += (m if i <= j else 0) + missed
            counters.block_hits += m if i == j else 0
