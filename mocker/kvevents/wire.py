"""vLLM's KV-event payload: msgpack `[ts, events, data_parallel_rank]`, events as maps or arrays."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kvevents.config import EventFormat
from mocker.kvevents.digests import DigestBook

__all__ = ["CURRENT", "END_SEQ", "BatchEncoder", "Dialect", "seq_bytes"]

# The replay end marker's sequence frame: -1 as 8 signed big-endian bytes.
END_SEQ = (-1).to_bytes(8, "big", signed=True)

# vLLM's struct fields after the ones every event carries (block_hashes, parent_block_hash,
# token_ids, block_size, lora_id, medium, lora_name / block_hashes, medium): they default
# to null, and vLLM (omit_defaults) leaves a null one out of a map, and the trailing nulls
# out of an array.
_STORED_TAIL = ("extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
                "locality", "ownership", "session_id", "lookahead_token_ids")  # fmt: skip
_REMOVED_TAIL = ("group_idx", "locality", "ownership")
_STORED_HEAD = ("type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                "lora_id", "medium", "lora_name")  # fmt: skip
_GPU = "GPU"
_CLEARED = {"type": "AllBlocksCleared"}


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class Dialect:
    """Which release's event contents a stream carries (vLLM 0.34's by default)."""

    # 0.34: a dense model's events name its one group, group 0, and a stored event the
    # group's kind ("full_attention"); 0.33 wrote no group field for a dense model.
    dense_group: bool = True
    # 0.34: an offload tier's BlockStored names one chunk's hash and group only (token ids
    # and parent left out) unless kv_connector_extra_config.self_describing_kv_events is on;
    # 0.33 described the blocks in full.
    placeholders: bool = True

    @classmethod
    def vllm(cls, version: str, self_describing: bool = False) -> Dialect:
        """The dialect of a vLLM release ("0.33" or "0.34")."""
        if version == "0.33":
            return cls(dense_group=False, placeholders=False)
        return cls(dense_group=True, placeholders=not self_describing)


CURRENT = Dialect()  # vLLM 0.34's


def _group(event: BlockStored | BlockRemoved, dialect: Dialect) -> int | None:
    """The event's group as written: a dense model's is 0 from vLLM 0.34 (None before)."""
    group = event.group_idx
    return 0 if group is None and dialect.dense_group else group


def _stored(
    event: BlockStored, dialect: Dialect
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """(every event's fields, the optional tail) of the wire events one BlockStored makes."""
    group = _group(event, dialect)
    if event.medium != _GPU and dialect.placeholders:
        for block_hash in event.block_hashes:  # one a chunk (an offload key)
            yield ((block_hash,), None, (), 0, None, event.medium, None), (
                None, group, None, None, event.locality, event.ownership, None, None
            )  # fmt: skip
        return
    kind = event.kv_cache_spec_kind
    if kind is None and group is not None:
        kind = "full_attention"
    yield (
        (event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size, None,
         event.medium, event.lora_name),
        (None, group, kind, event.kv_cache_spec_sliding_window, event.locality,
         event.ownership, event.session_id, None),
    )  # fmt: skip


def _removed_tail(event: BlockRemoved, dialect: Dialect) -> tuple[Any, ...]:
    group = _group(event, dialect)
    return group, event.locality, event.ownership


def _as_map(event: KVEvent, dialect: Dialect, out: list[Any]) -> None:
    # Key order follows vLLM's structs: the "type" tag, then the fields as declared.
    # parent_block_hash, lora_id, medium and lora_name have no default there, so they are
    # always written, null or not (vLLM's decoder rejects an event without them); the tail
    # (_STORED_TAIL) only when set. Written out by hand: this runs for every event sent.
    if type(event) is BlockStored:
        if event.medium != _GPU and dialect.placeholders:
            for head, tail in _stored(event, dialect):
                chunk = dict(zip(_STORED_HEAD, ("BlockStored", *head), strict=True))
                chunk.update((k, v) for k, v in zip(_STORED_TAIL, tail, strict=True)
                             if v is not None)  # fmt: skip
                out.append(chunk)
            return
        stored: dict[str, Any] = {
            "type": "BlockStored", "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash, "token_ids": event.token_ids,
            "block_size": event.block_size, "lora_id": None, "medium": event.medium,
            "lora_name": event.lora_name,
        }  # fmt: skip
        group = _group(event, dialect)
        if group is not None:
            stored["group_idx"] = group
            stored["kv_cache_spec_kind"] = event.kv_cache_spec_kind or "full_attention"
            if event.kv_cache_spec_sliding_window is not None:
                stored["kv_cache_spec_sliding_window"] = event.kv_cache_spec_sliding_window
        if event.locality is not None:
            stored["locality"] = event.locality
        if event.ownership is not None:
            stored["ownership"] = event.ownership
        if event.session_id is not None:
            stored["session_id"] = event.session_id
        out.append(stored)
    elif type(event) is BlockRemoved:
        removed: dict[str, Any] = {
            "type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": event.medium,
        }  # fmt: skip
        group = _group(event, dialect)
        if group is not None:
            removed["group_idx"] = group
        if event.locality is not None:
            removed["locality"] = event.locality
        if event.ownership is not None:
            removed["ownership"] = event.ownership
        out.append(removed)
    elif type(event) is AllBlocksCleared:
        out.append(_CLEARED)
    else:
        raise TypeError(f"not a KV event: {event!r}")


def _trimmed(tail: tuple[Any, ...]) -> tuple[Any, ...]:
    """The optional fields up to the last one set (a set one after an unset: null between)."""
    end = len(tail)
    while end and tail[end - 1] is None:
        end -= 1
    return tail[:end]


def _as_array(event: KVEvent, dialect: Dialect, out: list[Any]) -> None:
    # The positional layout: the tag first, then the same fields in the same order.
    if type(event) is BlockStored:
        out.extend(
            ("BlockStored", *head, *_trimmed(tail)) for head, tail in _stored(event, dialect)
        )
    elif type(event) is BlockRemoved:
        tail = _trimmed(_removed_tail(event, dialect))
        out.append(("BlockRemoved", event.block_hashes, event.medium, *tail))
    elif type(event) is AllBlocksCleared:
        out.append(("AllBlocksCleared",))
    else:
        raise TypeError(f"not a KV event: {event!r}")


class BatchEncoder:
    """Encodes one step's events as vLLM's EventBatch payload: block hashes as uint64, or
    with `full_hashes` as their digests (batches must then be encoded in stream order)."""

    __slots__ = ("_convert", "_dialect", "_digests", "_encoder", "rank")

    def __init__(
        self,
        fmt: EventFormat = EventFormat.MAP,
        rank: int = 0,
        dialect: Dialect = CURRENT,
        full_hashes: bool = False,
    ) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._convert = _as_map if EventFormat(fmt) is EventFormat.MAP else _as_array
        self._dialect = dialect
        self._digests = DigestBook() if full_hashes else None
        self.rank = rank

    def encode(self, ts: float, events: Sequence[KVEvent]) -> bytes:
        convert, dialect = self._convert, self._dialect
        if self._digests is not None:
            events = self._digests.convert(events)
        wire: list[Any] = []
        for event in events:
            convert(event, dialect, wire)
        return self._encoder.encode((ts, wire, self.rank))
