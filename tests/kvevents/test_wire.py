"""The msgpack payload: `[ts, events, rank]`, events as vLLM's tagged maps or positional arrays."""

from __future__ import annotations

import msgspec
import pytest

from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kv.hashing import BlockHash
from mocker.kvevents.config import EventFormat
from mocker.kvevents.wire import END_SEQ, BatchEncoder, Dialect, seq_bytes
from tests.support.hashes import hash_tuple
from tests.support.kv_consumer import decoder

BIG = 2**64 - 1  # hashes are uint64: the top bit set must survive
EVENTS: list[KVEvent] = [
    AllBlocksCleared(),
    BlockStored(
        block_hashes=hash_tuple(BIG, 7),
        parent_block_hash=None,
        token_ids=(1, 2, 3, 4),
        block_size=2,
    ),
    BlockStored(
        block_hashes=hash_tuple(9),
        parent_block_hash=BlockHash(7),
        token_ids=(5, 6),
        block_size=2,
        lora_name="sql-lora",
        medium="CPU",
    ),
    BlockRemoved(block_hashes=hash_tuple(BIG)),
    BlockRemoved(block_hashes=hash_tuple(9), medium="CPU"),
]


V033 = Dialect.vllm("0.33")


def test_map_form_raw_layout() -> None:
    payload = BatchEncoder(EventFormat.MAP, rank=3).encode(12.5, EVENTS)
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert (ts, rank) == (12.5, 3)
    assert events[0] == {"type": "AllBlocksCleared"}
    # The tag first, then every field in vLLM's order; the nullable ones present as null;
    # a dense model's group (0) and its kind, as vLLM 0.34's KVCacheManager annotates them.
    assert list(events[1]) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name", "group_idx", "kv_cache_spec_kind",
    ]  # fmt: skip
    assert events[1]["parent_block_hash"] is None and events[1]["lora_id"] is None
    assert events[1]["lora_name"] is None
    assert (events[1]["group_idx"], events[1]["kv_cache_spec_kind"]) == (0, "full_attention")
    # An offload tier's store names the chunk's hash and group only (vLLM 0.34's placeholder
    # payload, without self_describing_kv_events).
    assert events[2] == {"type": "BlockStored", "block_hashes": [9], "parent_block_hash": None,
                         "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU",
                         "lora_name": None, "group_idx": 0}  # fmt: skip
    assert events[3] == {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU",
                         "group_idx": 0}  # fmt: skip
    assert events[4] == {"type": "BlockRemoved", "block_hashes": [9], "medium": "CPU",
                         "group_idx": 0}  # fmt: skip
    assert b"\xcf" + BIG.to_bytes(8, "big") in payload  # msgpack uint64


def test_vllm_033_map_form_raw_layout() -> None:
    payload = BatchEncoder(EventFormat.MAP, rank=3, dialect=V033).encode(12.5, EVENTS)
    _, events, _ = msgspec.msgpack.decode(payload)
    assert list(events[1]) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name",
    ]  # fmt: skip
    assert events[2]["token_ids"] == [5, 6] and events[2]["lora_name"] == "sql-lora"
    assert events[3] == {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU"}


def test_array_form_raw_layout() -> None:
    payload = BatchEncoder(EventFormat.ARRAY).encode(1.0, EVENTS)
    _, events, rank = msgspec.msgpack.decode(payload)
    assert rank == 0
    assert events[0] == ["AllBlocksCleared"]
    assert events[1] == ["BlockStored", [BIG, 7], None, [1, 2, 3, 4], 2, None, "GPU", None,
                         None, 0, "full_attention"]  # fmt: skip
    assert events[2] == ["BlockStored", [9], None, [], 0, None, "CPU", None, None, 0]
    assert events[4] == ["BlockRemoved", [9], "CPU", 0]
    _, old, _ = msgspec.msgpack.decode(
        BatchEncoder(EventFormat.ARRAY, dialect=V033).encode(1.0, EVENTS)
    )
    assert old[1] == ["BlockStored", [BIG, 7], None, [1, 2, 3, 4], 2, None, "GPU", None]
    assert old[2] == ["BlockStored", [9], 7, [5, 6], 2, None, "CPU", "sql-lora"]
    assert old[4] == ["BlockRemoved", [9], "CPU"]


def test_an_offload_store_is_one_placeholder_a_chunk_unless_self_describing() -> None:
    cpu = BlockStored(block_hashes=hash_tuple(3, 4), parent_block_hash=BlockHash(2),
                      token_ids=(1, 2, 3, 4), block_size=2, lora_name="sql-lora",
                      medium="CPU")  # fmt: skip
    _, events, _ = msgspec.msgpack.decode(BatchEncoder().encode(1.0, [cpu]))
    assert [e["block_hashes"] for e in events] == [[3], [4]]
    assert all(e["token_ids"] == [] and e["parent_block_hash"] is None for e in events)
    full = BatchEncoder(dialect=Dialect.vllm("0.34", self_describing=True)).encode(1.0, [cpu])
    (event,) = msgspec.msgpack.decode(full)[1]
    assert event["block_hashes"] == [3, 4] and event["parent_block_hash"] == 2
    assert event["token_ids"] == [1, 2, 3, 4] and event["lora_name"] == "sql-lora"
    assert (event["group_idx"], event["kv_cache_spec_kind"]) == (0, "full_attention")


def test_a_session_is_written_after_ownership() -> None:
    event = BlockStored(block_hashes=hash_tuple(7), parent_block_hash=None, token_ids=(1, 2),
                        block_size=2, session_id="conv-1")  # fmt: skip
    (mapped,) = msgspec.msgpack.decode(BatchEncoder().encode(1.0, [event]))[1]
    assert list(mapped)[-3:] == ["group_idx", "kv_cache_spec_kind", "session_id"]
    assert mapped["session_id"] == "conv-1"
    (array,) = msgspec.msgpack.decode(BatchEncoder(EventFormat.ARRAY).encode(1.0, [event]))[1]
    # extra_keys, group_idx, kind, window, locality, ownership, session_id
    assert array[8:] == [None, 0, "full_attention", None, None, None, "conv-1"]
    for fmt in EventFormat:
        batch = decoder(fmt is EventFormat.ARRAY).decode(BatchEncoder(fmt).encode(1.0, [event]))
        assert batch.events[0].session_id == "conv-1" and batch.events[0].ownership is None


@pytest.mark.parametrize("fmt", list(EventFormat))
@pytest.mark.parametrize("dialect", [Dialect(), V033], ids=["0.34", "0.33"])
def test_decodes_with_reference_structs(fmt: EventFormat, dialect: Dialect) -> None:
    array_like = fmt is EventFormat.ARRAY
    batch = decoder(array_like).decode(BatchEncoder(fmt, 1, dialect).encode(3.25, EVENTS))
    assert batch.ts == 3.25 and batch.data_parallel_rank == 1
    kinds = [type(e).__name__ for e in batch.events]
    assert kinds == ["AllBlocksCleared", "BlockStored", "BlockStored", "BlockRemoved",
                     "BlockRemoved"]  # fmt: skip
    stored = batch.events[2]
    assert stored.block_hashes == [9] and stored.medium == "CPU" and stored.lora_id is None
    if dialect.placeholders:
        assert stored.parent_block_hash is None and stored.token_ids == [] and not stored.lora_name
    else:
        assert stored.parent_block_hash == 7 and stored.token_ids == [5, 6]
        assert stored.block_size == 2 and stored.lora_name == "sql-lora"
    assert stored.extra_keys is None
    assert batch.events[1].block_hashes == [BIG, 7]
    assert batch.events[1].group_idx == (0 if dialect.dense_group else None)
    assert batch.events[3].block_hashes == [BIG] and batch.events[3].medium == "GPU"


def test_a_decoder_for_the_other_layout_rejects_it() -> None:
    payload = BatchEncoder(EventFormat.MAP).encode(1.0, EVENTS)
    with pytest.raises(msgspec.ValidationError):
        decoder(array_like=True).decode(payload)


def test_sequence_frames() -> None:
    assert seq_bytes(0) == bytes(8) and seq_bytes(258) == b"\x00" * 6 + b"\x01\x02"
    assert END_SEQ == b"\xff" * 8


HYBRID: list[KVEvent] = [
    BlockStored(block_hashes=hash_tuple(5), parent_block_hash=BlockHash(4), token_ids=(1, 2),
                block_size=2, group_idx=0, kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=128),
    BlockStored(block_hashes=hash_tuple(6), parent_block_hash=None, token_ids=(3, 4), block_size=2,
                group_idx=3, kv_cache_spec_kind="mamba"),
    BlockRemoved(block_hashes=hash_tuple(5), group_idx=0),
]  # fmt: skip


def test_group_fields_in_both_layouts() -> None:
    # vLLM 0.33's trailing fields after extra_keys (left out as null): group_idx,
    # kv_cache_spec_kind, kv_cache_spec_sliding_window on BlockStored, group_idx on
    # BlockRemoved; omitted when unset in the map form (a dense model's stream is unchanged).
    _, events, _ = msgspec.msgpack.decode(BatchEncoder(EventFormat.MAP).encode(1.0, HYBRID))
    assert list(events[0])[-3:] == [
        "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"
    ]  # fmt: skip
    assert events[0]["kv_cache_spec_sliding_window"] == 128
    assert events[1]["group_idx"] == 3 and "kv_cache_spec_sliding_window" not in events[1]
    assert events[2] == {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU",
                         "group_idx": 0}  # fmt: skip
    _, arrays, _ = msgspec.msgpack.decode(BatchEncoder(EventFormat.ARRAY).encode(1.0, HYBRID))
    assert arrays[0][8:] == [None, 0, "sliding_window", 128]  # extra_keys null
    assert arrays[1][8:] == [None, 3, "mamba"]  # trailing nulls left out, as msgspec's
    assert arrays[2] == ["BlockRemoved", [5], "GPU", 0]
    for fmt in EventFormat:
        batch = decoder(fmt is EventFormat.ARRAY).decode(BatchEncoder(fmt).encode(1.0, HYBRID))
        stored, mamba, removed = batch.events
        assert (stored.group_idx, stored.kv_cache_spec_kind) == (0, "sliding_window")
        assert stored.kv_cache_spec_sliding_window == 128
        assert (mamba.group_idx, mamba.kv_cache_spec_kind) == (3, "mamba")
        assert removed.group_idx == 0


def _dense_layout(event: object) -> list[object]:
    """A dense (single-group) event as vLLM's array layout has always had it."""
    if isinstance(event, BlockStored):
        tokens = list(event.token_ids)
        return ["BlockStored", list(event.block_hashes), event.parent_block_hash, tokens,
                event.block_size, None, event.medium, event.lora_name]  # fmt: skip
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    return ["AllBlocksCleared"]


def test_a_dense_engine_under_vllm_033_writes_no_group_fields() -> None:
    # Stores, evictions, a CPU tier's stores and evictions, and a reset's re-announcements:
    # no event of a dense model carries a group field, in either layout (vLLM 0.33's stream;
    # 0.34's adds group 0 to each, tests above).
    from mocker.engine.core import EngineCore
    from mocker.engine.virtual import VirtualDriver
    from tests.support.engines import req, small_config

    config = small_config(num_gpu_blocks=12, enable_kv_cache_events=True, num_cpu_blocks=6,
                          offload_policy="write-through", max_num_seqs=2)  # fmt: skip
    core = EngineCore(config)
    events: list[KVEvent] = []
    requests = [req(f"r{i}", [100 * i + t for t in range(16)], max_tokens=2) for i in range(5)]
    for result in VirtualDriver(core).steps(requests):
        events += result.kv_events
    events += core.reset_prefix_cache(core.time)[1].kv_events
    kinds = {type(e).__name__ for e in events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    assert {e.medium for e in events if isinstance(e, BlockStored)} == {"GPU", "CPU"}
    for event in events:
        assert getattr(event, "group_idx", None) is None
        assert getattr(event, "kv_cache_spec_kind", None) is None
    payload = BatchEncoder(EventFormat.ARRAY, dialect=V033).encode(1.0, events)
    assert payload == msgspec.msgpack.encode([1.0, [_dense_layout(e) for e in events], 0])
    mapped = msgspec.msgpack.decode(
        BatchEncoder(EventFormat.MAP, dialect=V033).encode(1.0, events)
    )[1]
    for event in mapped:
        assert not {"group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"} & set(event)


def test_a_dense_stored_event_is_byte_for_byte_the_same() -> None:
    # One block of a dense model, array layout: [1.0, [["BlockStored", [7], null, [1, 2],
    # 2, null, "GPU", null]], 0], frozen as bytes (vLLM 0.33's; 0.34's adds null, 0,
    # "full_attention").
    event = BlockStored(
        block_hashes=hash_tuple(7), parent_block_hash=None, token_ids=(1, 2), block_size=2
    )
    payload = BatchEncoder(EventFormat.ARRAY, dialect=V033).encode(1.0, [event])
    assert payload.hex() == (
        "93cb3ff0000000000000"  # [ 1.0,
        "9198ab426c6f636b53746f726564"  # [[ "BlockStored",
        "9107c0920102"  # [7], null, [1, 2],
        "02c0a3475055c0"  # 2, null, "GPU", null ]],
        "00"  # 0 ]
    )
