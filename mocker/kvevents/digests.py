"""Block hashes as full digests on the wire (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

__all__ = ["DigestBook"]

_GPU = "GPU"


class DigestBook:
    """Turns a stream's events into their digest form, in stream order.

    The engine keys a block by its hash's low 64 bits; a stored block's hash arrives as a
    `FullHash` carrying the digest. A removal names only the 64-bit key, so the book keeps
    each announced block's digest while some (medium, group) holds it, as the stream says,
    and no longer. A key it never saw stored (a tier another engine filled) is its own 8
    bytes, which is the whole hash of mocker's fast algorithm."""

    __slots__ = ("_bits", "_book", "_unheld")

    def __init__(self) -> None:
        # key -> [digest, a bit per (medium, group) holding it]
        self._book: dict[int, list[Any]] = {}
        self._bits: dict[tuple[str, int | None], int] = {}
        self._unheld: list[int] = []  # held nowhere since a removal in this batch

    def __len__(self) -> int:
        return len(self._book)

    def digest(self, block_hash: int) -> bytes:
        """The digest of a block hash: its own, the announced one, or its 8 bytes."""
        own: bytes | None = getattr(block_hash, "digest", None)
        if own is not None:
            return own
        entry = self._book.get(block_hash)
        return entry[0] if entry is not None else int(block_hash).to_bytes(8, "big")

    def convert(self, events: Sequence[KVEvent]) -> list[KVEvent]:
        """The events with every block hash a digest (bytes), the book kept up to date. A
        block no medium holds any more is forgotten at the batch's end: within a step a
        tier's store can follow the device's removal of the same block (the device's events
        come first)."""
        out: list[KVEvent] = []
        for event in events:
            if type(event) is BlockStored:
                out.append(self._stored(event))
            elif type(event) is BlockRemoved:
                out.append(self._removed(event))
            else:
                if type(event) is AllBlocksCleared:
                    self._cleared()
                out.append(event)
        book = self._book
        for h in self._unheld:
            entry = book.get(h)
            if entry is not None and not entry[1]:
                del book[h]
        self._unheld = []
        return out

    def _bit(self, medium: str, group: int | None) -> int:
        bit = self._bits.get((medium, group))
        if bit is None:
            bit = self._bits[medium, group] = 1 << len(self._bits)
        return bit

    def _stored(self, event: BlockStored) -> BlockStored:
        book, bit = self._book, self._bit(event.medium, event.group_idx)
        digests = []
        for h in event.block_hashes:
            d = self.digest(h)
            entry = book.get(h)
            if entry is None:
                book[int(h)] = [d, bit]
            else:
                entry[1] |= bit
            digests.append(d)
        parent = event.parent_block_hash
        parent_digest = None if parent is None else self.digest(parent)
        return replace(
            event,
            block_hashes=cast(Any, tuple(digests)),
            parent_block_hash=cast(Any, parent_digest),
        )

    def _removed(self, event: BlockRemoved) -> BlockRemoved:
        book, bit = self._book, self._bit(event.medium, event.group_idx)
        digests = []
        for h in event.block_hashes:
            digests.append(self.digest(h))
            entry = book.get(h)
            if entry is not None:
                entry[1] &= ~bit
                if not entry[1]:
                    self._unheld.append(h)
        return replace(event, block_hashes=cast(Any, tuple(digests)))

    def _cleared(self) -> None:
        # vLLM's AllBlocksCleared is the device cache's reset: the tiers keep theirs.
        gpu = 0
        for (medium, _group), bit in self._bits.items():
            if medium == _GPU:
                gpu |= bit
        for h, entry in self._book.items():
            entry[1] &= ~gpu
            if not entry[1]:
                self._unheld.append(h)
