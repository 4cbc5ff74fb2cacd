"""Chained block hashes: hash(parent, block token ids, extra keys), seeded and deterministic."""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import NewType

__all__ = ["BlockHash", "BlockHasher", "extra_keys_bytes"]

# Low 64 bits of a keyed BLAKE2b digest: what goes on the wire as a uint64.
BlockHash = NewType("BlockHash", int)

_BIG_ENDIAN = sys.byteorder == "big"


def extra_keys_bytes(*keys: str | None) -> bytes:
    """Encode extra keys (LoRA name, cache salt, …) so that distinct tuples never collide."""
    if not any(k is not None for k in keys):
        return b""
    out = bytearray()
    for key in keys:
        if key is None:
            out += b"\x00"
        else:
            raw = key.encode()
            out += b"\x01" + len(raw).to_bytes(4, "big") + raw
    return bytes(out)


class BlockHasher:
    """Hashes full blocks of token ids into a chain; the seed plays vLLM's PYTHONHASHSEED role."""

    __slots__ = ("_key", "none_hash")

    def __init__(self, seed: int) -> None:
        self._key = seed.to_bytes(8, "big")
        # The parent of a request's first block, like vLLM's NONE_HASH.
        self.none_hash = BlockHash(self._digest(b"mocker:none-hash"))

    def _digest(self, payload: bytes) -> int:
        return int.from_bytes(
            hashlib.blake2b(payload, digest_size=8, key=self._key).digest(), "big"
        )

    def hash_block(
        self, parent: BlockHash | None, token_ids: Sequence[int], extra: bytes = b""
    ) -> BlockHash:
        """Hash of one full block given its parent's hash (None for the first block)."""
        head = (self.none_hash if parent is None else parent).to_bytes(8, "big")
        packed = array("I", token_ids)
        if _BIG_ENDIAN:
            packed.byteswap()  # the same hashes on every platform
        body = packed.tobytes()
        return BlockHash(self._digest(head + len(body).to_bytes(4, "big") + body + extra))

    def extend(
        self,
        hashes: list[BlockHash],
        token_ids: Sequence[int],
        block_size: int,
        extra: bytes = b"",
        first_extra: bytes = b"",
    ) -> None:
        """Append hashes for the full blocks of `token_ids` not yet in `hashes`.

        Block 0 uses `first_extra` instead of `extra` when given (vLLM adds the cache salt
        to the first block's extra keys; encode both keys together there, so a salt can
        never be mistaken for a LoRA name).
        """
        start = len(hashes)
        end = len(token_ids) // block_size
        parent = hashes[-1] if hashes else None
        for i in range(start, end):
            lo = i * block_size
            parent = self.hash_block(
                parent,
                token_ids[lo : lo + block_size],
                first_extra if i == 0 and first_extra else extra,
            )
            hashes.append(parent)
