"""vLLM's KV-event payload: msgpack `[ts, events, data_parallel_rank]`, events as maps or arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kvevents.config import EventFormat

__all__ = ["END_SEQ", "BatchEncoder", "seq_bytes"]

# The replay end marker's sequence frame: -1 as 8 signed big-endian bytes.
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def _as_map(event: KVEvent) -> dict[str, Any]:
    # Key order follows vLLM's structs: the "type" tag, then the fields as declared.
    # parent_block_hash, lora_id, medium and lora_name have no default there, so they are
    # always written, null or not (vLLM's decoder rejects an event without them).
    # The optional trailing fields (vLLM omits defaults) are written only when set.
    if type(event) is BlockStored:
        stored = {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
        if event.group_idx is not None:
            stored["group_idx"] = event.group_idx
            stored["kv_cache_spec_kind"] = event.kv_cache_spec_kind
            if event.kv_cache_spec_sliding_window is not None:
                stored["kv_cache_spec_sliding_window"] = event.kv_cache_spec_sliding_window
        if event.locality is not None:
            stored["locality"] = event.locality
        return stored
    if type(event) is BlockRemoved:
        removed: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": event.block_hashes,
                                   "medium": event.medium}  # fmt: skip
        if event.group_idx is not None:
            removed["group_idx"] = event.group_idx
        if event.locality is not None:
            removed["locality"] = event.locality
        return removed
    if type(event) is AllBlocksCleared:
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {event!r}")


def _as_array(event: KVEvent) -> tuple[Any, ...]:
    # The positional layout: the tag first, then the same fields in the same order.
    # A set locality or group is written after the optional fields before it (extra_keys,
    # group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window), left null when unset.
    if type(event) is BlockStored:
        stored: tuple[Any, ...] = (
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            None,
            event.medium,
            event.lora_name,
        )
        if event.group_idx is not None:
            stored += (None, event.group_idx, event.kv_cache_spec_kind,
                       event.kv_cache_spec_sliding_window)  # fmt: skip
            if event.locality is not None:
                stored += (event.locality,)
        elif event.locality is not None:
            stored += (None, None, None, None, event.locality)
        return stored
    if type(event) is BlockRemoved:
        if event.locality is not None:  # after group_idx
            return ("BlockRemoved", event.block_hashes, event.medium, event.group_idx,
                    event.locality)  # fmt: skip
        if event.group_idx is not None:
            return ("BlockRemoved", event.block_hashes, event.medium, event.group_idx)
        return ("BlockRemoved", event.block_hashes, event.medium)
    if type(event) is AllBlocksCleared:
        return ("AllBlocksCleared",)
    raise TypeError(f"not a KV event: {event!r}")


class BatchEncoder:
    """Encodes one step's events as vLLM's EventBatch payload (block hashes as uint64)."""

    __slots__ = ("_convert", "_encoder", "rank")

    def __init__(self, fmt: EventFormat = EventFormat.MAP, rank: int = 0) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._convert = _as_map if EventFormat(fmt) is EventFormat.MAP else _as_array
        self.rank = rank

    def encode(self, ts: float, events: Sequence[KVEvent]) -> bytes:
        convert = self._convert
        return self._encoder.encode((ts, [convert(e) for e in events], self.rank))
