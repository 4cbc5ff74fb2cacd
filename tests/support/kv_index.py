"""A test-side KV-event consumer: what a router learns from the stream, checked as it applies."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MEDIA = ("GPU", "CPU")


@dataclass(frozen=True, slots=True)
class Known:
    """One stored block as the stream described it."""

    parent: int | None
    tokens: tuple[int, ...]
    key: bytes | None  # the router's own key for it (see EventIndex); None: an orphan


def router_key(parent_key: bytes | None, tokens: Sequence[int]) -> bytes:
    """llm-d's way: a block's key is recomputed from its parent's key and its token ids; the
    engine's hash values are opaque handles for removal."""
    digest = hashlib.sha256(parent_key or b"root")
    digest.update(",".join(map(str, tokens)).encode())
    return digest.digest()


class EventIndex:
    """Applies Stored / Removed / AllBlocksCleared per medium, asserting as it goes that the
    stream never contradicts itself: no block stored twice or removed unseen, `token_ids`
    exactly `block_size` per hash, and a device block's parent cached on the device.

    Like a router, it keys a block by its parent's key and its tokens, and forgets a key
    once the block is stored nowhere. A block whose parent is stored nowhere cannot be
    keyed: an *orphan*. Never on the device when a block is computed or loaded; on the host
    tier it happens (a block is offloaded after its parent left the host, as with vLLM's
    offloading), and after a clear for re-announced blocks whose parent had been evicted.

    Works on the engine's event dataclasses and on events decoded from the wire alike
    (dispatch by class name, fields by attribute).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.media: dict[str, dict[int, Known]] = {m: {} for m in MEDIA}
        self.keys: dict[str, set[bytes]] = {m: set() for m in MEDIA}
        self.key_of: dict[int, bytes | None] = {}  # engine hash -> router key, while stored
        self.counts: dict[str, int] = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.orphans: dict[str, int] = {m: 0 for m in MEDIA}

    def apply(self, events: Iterable[Any]) -> None:
        after_clear = False  # the rest of a batch that cleared re-announces what remains
        for event in events:
            kind = type(event).__name__
            self.counts[kind] += 1
            if kind == "BlockStored":
                self._stored(event, after_clear)
            elif kind == "BlockRemoved":
                blocks, keys = self.media[event.medium], self.keys[event.medium]
                for h in event.block_hashes:
                    assert h in blocks, f"{event.medium} block {h} removed but never stored"
                    keys.discard(blocks.pop(h).key)
                    if not any(h in self.media[m] for m in MEDIA):
                        del self.key_of[h]
            elif kind == "AllBlocksCleared":
                for medium in MEDIA:
                    self.media[medium].clear()
                    self.keys[medium].clear()
                self.key_of.clear()
                after_clear = True
            else:
                raise AssertionError(f"unknown event {event!r}")

    def _stored(self, event: Any, reannounced: bool) -> None:
        bs, medium = self.block_size, event.medium
        assert event.block_size == bs
        assert len(event.token_ids) == bs * len(event.block_hashes), "token_ids per block"
        blocks = self.media[medium]
        parent = event.parent_block_hash
        if medium == "GPU" and parent is not None and not reannounced:
            # A request holds its whole prefix, so a block it computes or loads has its
            # parent cached on the device. (Not so for a re-announced block: LRU may have
            # evicted the parent of a block a write-through copy held.)
            assert parent in blocks, f"GPU block stored under uncached parent {parent}"
        orphan = parent is not None and self.key_of.get(parent) is None
        if orphan:
            assert medium != "GPU" or reannounced, f"GPU block under unknown parent {parent}"
        parent_key = None if parent is None else self.key_of.get(parent)
        for i, h in enumerate(event.block_hashes):
            assert h not in blocks, f"{medium} block {h} stored twice without a removal"
            tokens = tuple(event.token_ids[i * bs : (i + 1) * bs])
            key = None if orphan else router_key(parent_key, tokens)
            blocks[h] = Known(parent, tokens, key)
            if key is None:
                self.orphans[medium] += 1
            else:
                self.keys[medium].add(key)
            self.key_of.setdefault(h, key)
            if self.key_of[h] is None:
                self.key_of[h] = key
            parent, parent_key = h, key

    def hashes(self, medium: str = "GPU") -> set[int]:
        return set(self.media[medium])

    def predict_cached_tokens(self, prompt: Sequence[int], medium: str = "GPU") -> int:
        """The prefix hit a router predicts for `prompt`: leading blocks whose recomputed
        key is cached, at most (len - 1) // block_size of them (the last prompt token is
        always computed)."""
        bs = self.block_size
        keys = self.keys[medium]
        hit, parent_key = 0, None
        for i in range((len(prompt) - 1) // bs):
            key = router_key(parent_key, prompt[i * bs : (i + 1) * bs])
            if key not in keys:
                break
            hit, parent_key = hit + 1, key
        return hit * bs
